"""What the load driver and the proxy tell each other, typed.

    driver -> proxy: `Submission`, one per released request
    proxy -> client: the `ClientPort` calls, as things happen: a request
                     arrived, was first scheduled, got tokens, a KV load of
                     it started or ended, it finished. Times are run seconds
                     stamped by the proxy (the node's clock for `scheduled`
                     and KV events).

Each runtime implements the port its own way: in-process the calls write
the client's records at once (cluster/inproc/records.py); on Ray they become
`ClientEvent`s (`EventPublisher`), NamedTuples that cross Ray as pickles to
the driver or the OpenAI front door, which write them into records with
`apply_to_record`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from engine.records import RequestRecord, WorkloadRequest
from node.messages import KVEvent


class Submission(NamedTuple):
    request_id: str
    prompt_len: int
    output_len: int
    priority: int = 0
    prompt_segments: tuple[tuple[int, int], ...] = ()
    # Sampling a client asked for (`bench/serve/`); ignore_eos None: the cluster's sampler setting.
    ignore_eos: bool | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, w: WorkloadRequest) -> Submission:
        """A workload request as the load driver releases it (either runtime, and serving)."""
        return cls(
            w.request_id,
            w.prompt_len,
            w.output_len,
            w.priority,
            w.prompt_segments,
            w.ignore_eos,
            w.min_tokens,
            w.stop_token_ids,
        )


class Arrived(NamedTuple):
    request_id: str
    time: float


class Scheduled(NamedTuple):
    """First scheduled at a node (the node's clock)."""

    request_id: str
    time: float


class Tokens(NamedTuple):
    request_id: str
    token_ids: list[int]
    time: float


class Finished(NamedTuple):
    request_id: str
    reason: str
    time: float
    num_preemptions: int
    node: str  # where the request was when it finished ("" if nowhere)


class Breakdown(NamedTuple):
    """Where the request's first token went (proxy/breakdown.py): its TTFT in parts, run seconds."""

    request_id: str
    parts: dict[str, float]


ClientEvent = Arrived | Scheduled | KVEvent | Tokens | Finished | Breakdown


class ClientPort(Protocol):
    """Where the proxy reports what the client of each request sees."""

    def arrived(self, request_id: str, time: float) -> None: ...

    def scheduled(self, request_id: str, time: float) -> None: ...

    def tokens(self, request_id: str, token_ids: list[int], time: float) -> None: ...

    def token_run(self, request_id: str, first: int, times: list[float]) -> None:
        """One token per time in `times`, the request's outputs `first`,
        `first + 1`, ...: their ids are the sampler's (sampling is per
        position). The steady-decode bulk path's form of `tokens`
        (proxy/token_runs.py); only the in-process runtime produces it."""
        ...

    def kv_event(self, event: KVEvent) -> None: ...

    def ttft_breakdown(self, request_id: str, parts: dict[str, float]) -> None:
        """The request's TTFT in parts (proxy/breakdown.py), at its first token."""
        ...

    def finished(self, event: Finished) -> None: ...


class EventPublisher:
    """A `ClientPort` that hands each call on as a `ClientEvent` (the Ray
    proxy's stream to the driver or the front door)."""

    def __init__(self, publish: Callable[[list[ClientEvent]], None]) -> None:
        self.publish = publish

    def arrived(self, request_id: str, time: float) -> None:
        self.publish([Arrived(request_id, time)])

    def scheduled(self, request_id: str, time: float) -> None:
        self.publish([Scheduled(request_id, time)])

    def tokens(self, request_id: str, token_ids: list[int], time: float) -> None:
        self.publish([Tokens(request_id, token_ids, time)])

    def token_run(self, request_id: str, first: int, times: list[float]) -> None:
        raise NotImplementedError("token runs come from the in-process steady-decode path only")

    def kv_event(self, event: KVEvent) -> None:
        self.publish([event])

    def ttft_breakdown(self, request_id: str, parts: dict[str, float]) -> None:
        self.publish([Breakdown(request_id, parts)])

    def finished(self, event: Finished) -> None:
        self.publish([event])


def apply_to_record(rec: RequestRecord, ev: ClientEvent) -> bool:
    """One client event (other than `Arrived`, which makes or dates the
    record) written into its request's record, as the client sees it; True
    when it finished the request. A finished record takes nothing more."""
    if rec.finish_reason is not None:
        return False
    if isinstance(ev, Tokens):
        rec.output_token_ids.extend(ev.token_ids)
        rec.token_times.extend([ev.time] * len(ev.token_ids))
    elif isinstance(ev, Scheduled):
        if rec.first_scheduled_time is None:
            rec.first_scheduled_time = ev.time
    elif isinstance(ev, KVEvent):
        if ev.phase == "start":
            rec.remote_kv_wait_start = ev.time
        else:
            rec.remote_kv_wait_end = ev.time
    elif isinstance(ev, Breakdown):
        rec.ttft_breakdown = dict(ev.parts)
    elif isinstance(ev, Finished):
        rec.finish_reason, rec.finish_time, rec.num_preemptions = ev.reason, ev.time, ev.num_preemptions
        return True
    return False
