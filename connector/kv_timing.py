"""What a KV connector's transfer costs beyond the network link: the terms
vLLM's P/D connectors spend between "the decode node asks for a request's
KV" and "every block is in" (docs/cost-model.md, "The P/D hand-off").

- `handshake_s`: once per (consumer, producer) pair, on first contact: the
  NIXL agents exchange their metadata (memory registrations, descriptor
  lists) before the first read; cached after.
- `metadata_s`: per request: the transfer's own metadata (remote block ids,
  engine id) reaching the worker that issues the read.
- `transfer_latency_s`: per transfer (per attempt): issuing the read and
  its completion notification.
- `descriptor_us`: per transfer descriptor. A connector reads each block of
  each layer's K and V as one descriptor (`descriptors_per_block` = 2 x
  layers, x prefill TP / decode TP when a decode rank reads from several
  prefill ranks), so a small `block_size` splits a prompt into many small
  reads, which is what dominated the NIXL window in vLLM RFC #50913.
- `bandwidth_GBps`: the transfer's payload (the cluster's `bytes_per_token`
  x tokens) at the connector's bandwidth; None: the link's bandwidth alone.

Pure and clock-free: a transport asks `setup_s` before an attempt's request
goes out and `transfer_s` once its payload is served, and schedules the
delays on its own clock (in-process: the virtual clock; gRPC: scaled by
`time_scale`). The state it needs (peers contacted, requests seen) is the
transport's, in a `KVContacts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine.setting import MAX_TERM_S, setting


@dataclass(frozen=True)
class KVTransferTiming:
    """The terms, declared here (engine/setting.py); the scenario's
    `cluster.kv_transfer` overrides a preset's values of them."""

    name: str = "none"
    handshake_s: float = setting(
        0.0, doc="First contact with a producer (once per consumer-producer pair).", ge=0, le=MAX_TERM_S
    )
    metadata_s: float = setting(0.0, doc="Per request: the transfer's metadata.", ge=0, le=MAX_TERM_S)
    transfer_latency_s: float = setting(0.0, doc="Per transfer (attempt): issue and completion.", ge=0, le=MAX_TERM_S)
    descriptor_us: float = setting(0.0, doc="Per transfer descriptor (one block of one layer's K or V).", ge=0, le=1e6)
    bandwidth_GBps: float | None = setting(
        None, doc="The connector's bandwidth (GB/s); null: the link's alone.", gt=0, le=1e6
    )
    descriptors_per_block: int = 1

    @property
    def is_free(self) -> bool:
        """No term costs anything: the transport behaves as before the model."""
        return (
            self.handshake_s == 0
            and self.metadata_s == 0
            and self.transfer_latency_s == 0
            and self.descriptor_us == 0
            and self.bandwidth_GBps is None
        )

    def scaled(self, time_scale: float) -> KVTransferTiming:
        """The same terms in run seconds on a wall clock that sleeps
        `time_scale` seconds per modelled second."""
        return replace(
            self,
            handshake_s=self.handshake_s * time_scale,
            metadata_s=self.metadata_s * time_scale,
            transfer_latency_s=self.transfer_latency_s * time_scale,
            descriptor_us=self.descriptor_us * time_scale,
            bandwidth_GBps=None if self.bandwidth_GBps is None else self.bandwidth_GBps / time_scale,
        )

    def setup_s(self, first_contact: bool, first_attempt: bool) -> float:
        """Before an attempt's read can start: the handshake with a peer not
        contacted yet, the request's metadata on its first attempt."""
        return (self.handshake_s if first_contact else 0.0) + (self.metadata_s if first_attempt else 0.0)

    def transfer_s(self, num_blocks: int, num_bytes: int) -> float:
        """The read itself, beyond the link's transit: per-transfer latency,
        per-descriptor cost and the payload at the connector's bandwidth."""
        t = self.transfer_latency_s + num_blocks * self.descriptors_per_block * self.descriptor_us * 1e-6
        if self.bandwidth_GBps is not None:
            t += num_bytes / (self.bandwidth_GBps * 1e9)
        return t


@dataclass
class KVContacts:
    """A consumer's memory of its handshakes (when each peer's completes)
    and of the requests whose metadata it has sent (one per transport)."""

    ready_at: dict[str, float] = field(default_factory=dict)  # peer -> its handshake's end
    requests: set[str] = field(default_factory=set)

    def start_at(self, timing: KVTransferTiming, peer: str, request_id: str, now: float) -> float:
        """When an attempt made at `now` can send its read: after the
        handshake with `peer` (started now on first contact; a handshake in
        progress is waited for, as vLLM's NIXL connector queues a peer's
        requests behind it) and, on the request's first attempt, its metadata.
        A handshake is not retried: once started it counts as made."""
        ready = self.ready_at.get(peer)
        if ready is None:
            ready = self.ready_at[peer] = now + timing.setup_s(True, False)
        start = max(now, ready)
        if request_id not in self.requests:
            self.requests.add(request_id)
            start += timing.metadata_s
        return start

    def forget_request(self, request_id: str) -> None:
        self.requests.discard(request_id)


NO_KV_TIMING = KVTransferTiming()
