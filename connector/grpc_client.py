"""Consumer side of the KV handoff: `KVPuller` pulls a request's blocks over gRPC.

    puller = KVPuller(sink, PullerConfig(deadline_s=10), link=LinkSpec(delay_ms=5))
    result = await puller.pull(request_id, "127.0.0.1:50051", remote_block_ids, local_block_ids)
    ...
    await puller.close()

A pull verifies every block's CRC-32, writes each good block to the sink as
soon as it is complete, then tells the producer (ReportDone) so it can free
its copy. A lost, timed-out, corrupted or broken attempt is retried for just
the blocks still missing, each attempt with its own timeout, all within one
overall deadline; a producer that is gone makes the pull fail at that
deadline — it never hangs. (Once every block is in, ReportDone gets at least
one attempt even if the deadline has just passed, so a successful pull can
take up to deadline_s + attempt_timeout_s.) One channel per producer address is reused;
`max_concurrent_pulls` bounds how many pulls run at once.

All of a puller's calls must happen on one event loop (gRPC aio channels are
bound to the loop they were created on).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from connector.grpc_framing import BlockAssembler, ChecksumMismatch, ProtocolError
from connector.grpc_link import link_interceptors
from connector.grpc_pull_config import FINAL_CODES, RETRYABLE_CODES, PullerConfig
from connector.grpc_wire import channel_options
from connector.link import Link, LinkSpec
from connector.transport import BlockSink, PullFailure, PullResult
from protos.disagg import kv_handoff_pb2 as pb
from protos.disagg import kv_handoff_pb2_grpc as pb_grpc

__all__ = ["KVPuller", "PullerConfig"]


class SinkError(Exception):
    pass


class _IncompleteAttempt(Exception):
    """The stream ended cleanly but some blocks are still missing."""

    def __init__(self, corrupted: bool) -> None:
        super().__init__()
        self.corrupted = corrupted  # some arrived but failed their checksum


@dataclass
class _PullState:
    """What one pull has achieved so far, across its attempts."""

    request_id: str
    remote_block_ids: list[int]
    local_block_ids: list[int]
    missing: list[int]  # indices into the block lists, in order
    started: float
    deadline: float
    attempts: int = 0
    checksum_failures: int = 0
    num_bytes: int = 0
    transfer_done: float | None = None
    written: set[int] = field(default_factory=set)


def _validate_block_ids(name: str, ids: Sequence[int]) -> list[int]:
    out = list(ids)
    for block_id in out:
        if isinstance(block_id, bool) or not isinstance(block_id, int) or not 0 <= block_id < 2**32:
            raise ValueError(f"pull: {name} must hold ints in [0, 2**32), got {block_id!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"pull: {name} must not repeat a block id, got {out}")
    return out


class KVPuller:
    """Pulls KV blocks from producers' KVHandoff servers into a BlockSink."""

    def __init__(
        self,
        sink: BlockSink,
        config: PullerConfig | None = None,
        *,
        link: LinkSpec | None = None,
        reverse_link: LinkSpec | None = None,
        link_seed: int = 0,
        link_epoch: float | None = None,
    ) -> None:
        """`link` impairs every channel this puller opens (`reverse_link`, if
        given, the producer → consumer direction alone): one Link per address,
        seeded from `link_seed` and the order the channels were opened in.
        `link_epoch` is the time.monotonic() origin of the outage windows
        (default: now)."""
        if reverse_link is not None and link is None:
            link = LinkSpec()
        self.sink = sink
        self.config = config or PullerConfig()
        self._link_spec = link
        self._reverse_link_spec = reverse_link
        self._link_seed = link_seed
        self._link_epoch = time.monotonic() if link_epoch is None else link_epoch
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.KVHandoffStub] = {}
        self._links: dict[str, Link] = {}
        self._slots = asyncio.Semaphore(self.config.max_concurrent_pulls)
        self._background: set[asyncio.Task] = set()

    # -- channels --------------------------------------------------------------

    def _stub(self, address: str) -> pb_grpc.KVHandoffStub:
        stub = self._stubs.get(address)
        if stub is None:
            interceptors = []
            if self._link_spec is not None:
                # Seeded by the order channels were opened, not by the address:
                # ports are picked by the OS, and a rerun must draw the same.
                ordinal = len(self._channels)
                digest = hashlib.blake2b(f"{self._link_seed}/{ordinal}".encode(), digest_size=8)
                link = Link(
                    self._link_spec,
                    seed=int.from_bytes(digest.digest(), "big"),
                    reverse_spec=self._reverse_link_spec,
                )
                if not link.is_ideal:  # an ideal link costs nothing: leave it out
                    self._links[address] = link
                    interceptors.extend(link_interceptors(link, epoch=self._link_epoch))
            channel = grpc.aio.insecure_channel(
                address,
                options=channel_options(self.config.max_message_bytes),
                interceptors=interceptors or None,
            )
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.KVHandoffStub(channel)
        return stub

    @property
    def open_channels(self) -> int:
        return len(self._channels)

    def link_for(self, address: str) -> Link | None:
        """The link model impairing the channel to `address`, if any (for its counters)."""
        return self._links.get(address)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)

    async def __aenter__(self) -> "KVPuller":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- health ----------------------------------------------------------------

    async def check(self, remote_address: str, timeout_s: float = 1.0) -> bool:
        """True when the producer at `remote_address` answers SERVING in time."""
        try:
            response = await self._stub(remote_address).Check(
                pb.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
        return response.status == pb.HealthCheckResponse.SERVING

    # -- pull ------------------------------------------------------------------

    async def pull(
        self,
        request_id: str,
        remote_address: str,
        remote_block_ids: Sequence[int],
        local_block_ids: Sequence[int],
    ) -> PullResult:
        """Pull `remote_block_ids` of `request_id` from `remote_address` into the
        sink as `local_block_ids` (same length, paired by position)."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"pull: request_id must be a non-empty str, got {request_id!r}")
        remote = _validate_block_ids("remote_block_ids", remote_block_ids)
        local = _validate_block_ids("local_block_ids", local_block_ids)
        if len(remote) != len(local) or not remote:
            raise ValueError(
                f"pull: remote_block_ids ({len(remote)}) and local_block_ids ({len(local)}) "
                "must be non-empty and of equal length"
            )
        stub = self._stub(remote_address)  # opened in call order (see _stub)
        async with self._slots:
            started = time.monotonic()
            state = _PullState(
                request_id, remote, local, list(range(len(remote))),
                started=started, deadline=started + self.config.deadline_s,
            )
            return await self._run(state, stub)

    async def _run(self, state: _PullState, stub: pb_grpc.KVHandoffStub) -> PullResult:
        cfg = self.config
        backoff = cfg.backoff_initial_s
        failure, reason = PullFailure.DEADLINE_EXCEEDED, "no attempt fitted in the deadline"
        while state.missing:
            remaining = state.deadline - time.monotonic()
            if remaining <= 0:
                break
            written_before = len(state.written)
            state.attempts += 1
            try:
                await self._attempt(state, stub, min(cfg.attempt_timeout_s, remaining))
            except grpc.aio.AioRpcError as err:
                final = FINAL_CODES.get(err.code())
                if final is not None:
                    return self._failed(state, final, f"{err.code().name}: {err.details()}")
                failure = RETRYABLE_CODES.get(err.code(), PullFailure.PRODUCER_ERROR)
                reason = f"{err.code().name}: {err.details()}"
            except TimeoutError:
                failure, reason = PullFailure.DEADLINE_EXCEEDED, "attempt timed out"
            except _IncompleteAttempt as err:
                if err.corrupted:
                    failure = PullFailure.CHECKSUM_MISMATCH
                    reason = f"{state.checksum_failures} block(s) arrived corrupt so far"
                else:
                    failure, reason = PullFailure.PROTOCOL_ERROR, "stream ended with blocks missing"
            except ProtocolError as err:
                failure, reason = PullFailure.PROTOCOL_ERROR, str(err)
            except SinkError as err:
                self._report_failure_later(state, stub, f"sink error: {err}")
                return self._failed(state, PullFailure.SINK_ERROR, str(err))
            if not state.missing:
                break
            if len(state.written) > written_before:
                backoff = cfg.backoff_initial_s  # progress: retry promptly
            pause = min(backoff, max(0.0, state.deadline - time.monotonic()))
            await asyncio.sleep(pause)
            backoff = min(backoff * 2, cfg.backoff_max_s)
        if state.missing:
            if failure is not PullFailure.PRODUCER_UNAVAILABLE:
                self._report_failure_later(state, stub, reason)
            return self._failed(state, failure, reason)
        state.transfer_done = time.monotonic()
        done_reported = cfg.report_done and await self._report_done(state, stub)
        return self._result(state, ok=True, done_reported=done_reported)

    async def _attempt(self, state: _PullState, stub: pb_grpc.KVHandoffStub, timeout: float) -> None:
        """One PullBlocks call for the blocks still missing. Raises on a failed call."""
        wanted = list(state.missing)
        request = pb.PullRequest(
            request_id=state.request_id,
            block_ids=[state.remote_block_ids[i] for i in wanted],
            max_chunk_bytes=self.config.max_chunk_bytes,
            consumer_id=self.config.consumer_id,
            attempt=state.attempts,
        )
        assembler = BlockAssembler(request.block_ids)
        corrupt_before = state.checksum_failures
        call = stub.PullBlocks(request, timeout=timeout)
        try:
            # The asyncio timeout backs up gRPC's: it also bounds time spent in
            # interceptors (the link model) before the call reaches the wire.
            async with asyncio.timeout(timeout + 0.05):
                async for chunk in call:
                    for piece in chunk.pieces:
                        try:
                            complete = assembler.feed(piece)
                        except ChecksumMismatch:
                            state.checksum_failures += 1
                            continue
                        if complete is not None:
                            position, data = complete
                            await self._write(state, wanted[position], data)
        finally:
            call.cancel()
            state.missing = [i for i in state.missing if i not in state.written]
        if state.missing:
            raise _IncompleteAttempt(state.checksum_failures > corrupt_before)

    async def _write(self, state: _PullState, index: int, data: bytes) -> None:
        try:
            outcome = self.sink.write_block(
                state.local_block_ids[index], state.request_id, index, data
            )
            if inspect.isawaitable(outcome):
                await outcome
        except Exception as err:
            raise SinkError(f"{type(err).__name__}: {err}") from err
        state.written.add(index)
        state.num_bytes += len(data)

    # -- done reports ----------------------------------------------------------

    async def _report_done(self, state: _PullState, stub: pb_grpc.KVHandoffStub) -> bool:
        """ReportDone(success) until acknowledged or the deadline (at least once)."""
        cfg = self.config
        backoff = cfg.backoff_initial_s
        while True:
            remaining = state.deadline - time.monotonic()
            timeout = cfg.attempt_timeout_s if remaining <= 0 else min(cfg.attempt_timeout_s, remaining)
            try:
                async with asyncio.timeout(timeout + 0.05):
                    await stub.ReportDone(
                        pb.DoneRequest(
                            request_id=state.request_id, success=True, consumer_id=cfg.consumer_id
                        ),
                        timeout=timeout,
                    )
                return True
            except (grpc.aio.AioRpcError, TimeoutError) as err:
                if isinstance(err, grpc.aio.AioRpcError) and err.code() in FINAL_CODES:
                    return False
            if state.deadline - time.monotonic() <= 0:
                return False
            await asyncio.sleep(min(backoff, max(0.0, state.deadline - time.monotonic())))
            backoff = min(backoff * 2, cfg.backoff_max_s)

    def _report_failure_later(self, state: _PullState, stub: pb_grpc.KVHandoffStub, reason: str) -> None:
        """Tell a reachable producer the pull failed, without delaying the result."""
        if not self.config.report_done:
            return

        async def report() -> None:
            try:
                await stub.ReportDone(
                    pb.DoneRequest(
                        request_id=state.request_id, success=False,
                        consumer_id=self.config.consumer_id, reason=reason,
                    ),
                    timeout=self.config.attempt_timeout_s,
                )
            except (grpc.aio.AioRpcError, asyncio.TimeoutError):
                pass  # best effort: the producer frees on its own timeout

        task = asyncio.ensure_future(report())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- results ---------------------------------------------------------------

    def _result(self, state: _PullState, ok: bool, **fields: object) -> PullResult:
        now = time.monotonic()
        transfer_end = state.transfer_done if state.transfer_done is not None else now
        return PullResult(
            request_id=state.request_id,
            ok=ok,
            num_blocks=len(state.written),
            num_bytes=state.num_bytes,
            attempts=state.attempts,
            checksum_failures=state.checksum_failures,
            transfer_s=transfer_end - state.started,
            total_s=now - state.started,
            **fields,
        )

    def _failed(self, state: _PullState, failure: PullFailure, reason: str) -> PullResult:
        return self._result(state, ok=False, failure=failure, reason=reason)
