"""Consumer side of the KV handoff: `KVPuller` pulls a request's blocks over gRPC.

    puller = KVPuller(sink, PullerConfig(deadline_s=10), link=LinkSpec(delay_ms=5))
    result = await puller.pull(request_id, "127.0.0.1:50051", remote_block_ids, local_block_ids)
    ...
    await puller.close()

Two layers:

- `attempt(PullAttempt, on_block)` is one PullBlocks call: every block's
  CRC-32 is verified, each good block goes to `on_block` as soon as it is
  complete, and whatever goes wrong (a gRPC status, the attempt's timeout,
  broken framing, corrupt blocks, `on_block` raising) comes back as a
  `PullAttemptResult` — it never raises for those. `report(DoneReport)` is
  one ReportDone call. These are what `GrpcKVTransport` (kv_transport.py)
  offers the nodes, whose pull policy decides on retries.
- `pull(...)` runs a whole pull into the puller's sink under the one retry
  policy of the repository (`connector.pull_policy`: `PullSession`, then
  `DoneSession`), with `asyncio.sleep` for the backoff: a lost, timed-out,
  corrupted or broken attempt is retried for just the blocks still missing,
  each attempt with its own timeout, all within one overall deadline; a
  producer that is gone makes the pull fail at that deadline — it never
  hangs. Once every block is in, the producer is told (ReportDone) so it can
  free its copy; that report is retried for up to `deadline_s` after it was
  first sent, so a successful pull can take up to about 2 x deadline_s. After
  a failed pull one best-effort ReportDone(success=False) goes out in the
  background, and the result does not wait for it.

One channel per producer address is reused; `max_concurrent_pulls` bounds
how many `pull()`s run at once (single attempts are not bounded). Time is
`time.monotonic()`.

All of a puller's calls must happen on one event loop (gRPC aio channels are
bound to the loop they were created on).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence

import grpc

from connector.link import Link, LinkSpec
from connector.pull_policy import DoneSession, Failed, Landed, PullSession, Retry
from connector.transport import (
    BlockSink,
    DoneReport,
    DoneReportResult,
    PullAttempt,
    PullAttemptResult,
    PullFailure,
    PullResult,
)
from engine.kv_connector.pd_connector import RecvSpec
from protos.disagg import kv_handoff_pb2 as pb
from protos.disagg import kv_handoff_pb2_grpc as pb_grpc

from .framing import BlockAssembler, ChecksumMismatch, ProtocolError
from .link import link_interceptors
from .pull_config import FINAL_CODES, RETRYABLE_CODES, PullerConfig
from .security import KVSecurity
from .wire import channel_options

__all__ = ["KVPuller", "PullerConfig"]


def _validate_block_ids(name: str, ids: Sequence[int]) -> list[int]:
    out = list(ids)
    for block_id in out:
        if isinstance(block_id, bool) or not isinstance(block_id, int) or not 0 <= block_id < 2**32:
            raise ValueError(f"pull: {name} must hold ints in [0, 2**32), got {block_id!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"pull: {name} must not repeat a block id, got {out}")
    return out


class KVPuller:
    """Pulls KV blocks from producers' KVHandoff servers: one attempt at a
    time (`attempt`, `report`), or whole pulls into a BlockSink (`pull`)."""

    def __init__(
        self,
        sink: BlockSink | None = None,
        config: PullerConfig | None = None,
        *,
        link: LinkSpec | None = None,
        reverse_link: LinkSpec | None = None,
        link_seed: int = 0,
        link_epoch: float | None = None,
        security: KVSecurity | None = None,
    ) -> None:
        """`security`: the run's KV token sent with every call, and TLS.
        `link` impairs every channel this puller opens (`reverse_link`, if
        given, the producer → consumer direction alone): one Link per address,
        seeded from `link_seed` and the order the channels were opened in.
        `link_epoch` is the time.monotonic() origin of the outage windows
        (default: now). `sink` is needed by `pull()` only: `attempt()` hands
        blocks to its caller's `on_block`."""
        if reverse_link is not None and link is None:
            link = LinkSpec()
        self.sink = sink
        self.config = config or PullerConfig()
        self.security = security or KVSecurity()
        self._metadata = self.security.call_metadata()
        self._link_spec = link
        self._reverse_link_spec = reverse_link
        self._link_seed = link_seed
        self._link_epoch = time.monotonic() if link_epoch is None else link_epoch
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.KVHandoffStub] = {}
        self._links: dict[str, Link] = {}
        self._policy = self.config.fault_policy()
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
            options = channel_options(self.config.max_message_bytes) + self.security.channel_options()
            credentials = self.security.channel_credentials()
            chained = interceptors or None
            if credentials is not None:
                channel = grpc.aio.secure_channel(address, credentials, options=options, interceptors=chained)
            else:
                channel = grpc.aio.insecure_channel(address, options=options, interceptors=chained)
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.KVHandoffStub(channel)
        return stub

    def set_link_epoch(self, epoch: float) -> None:
        """The origin of the outage windows for channels opened from now on."""
        self._link_epoch = epoch

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

    async def __aenter__(self) -> KVPuller:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- health ----------------------------------------------------------------

    async def check(self, remote_address: str, timeout_s: float = 1.0) -> bool:
        """True when the producer at `remote_address` answers SERVING in time."""
        try:
            response = await self._stub(remote_address).Check(
                pb.HealthCheckRequest(), timeout=timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError:
            return False
        return response.status == pb.HealthCheckResponse.SERVING

    # -- one attempt -----------------------------------------------------------

    async def attempt(
        self,
        attempt: PullAttempt,
        on_block: Callable[[PullAttempt, int, bytes], None | Awaitable[None]],
    ) -> PullAttemptResult:
        """One PullBlocks call for `attempt.remote_block_ids`, bounded by
        `attempt.timeout_s` (gRPC's deadline, backed up by an asyncio timeout
        that also covers time spent in the link model before the wire).

        Each block that arrives complete and intact goes to
        `on_block(attempt, attempt.block_indices[position], data)`, which may
        return an awaitable (awaited before the stream goes on); if it raises,
        the attempt ends with SINK_ERROR. Never raises for a gRPC status, a
        timeout or a broken stream: the result says which blocks landed and,
        unless all did, why the attempt stopped short.
        """
        wanted = attempt.remote_block_ids
        request = pb.PullRequest(
            request_id=attempt.remote_request_id,
            block_ids=wanted,
            max_chunk_bytes=self.config.max_chunk_bytes,
            consumer_id=attempt.consumer_id or self.config.consumer_id,
            attempt=attempt.number,
            ticket=attempt.ticket,
        )
        landed: list[int] = []
        num_bytes = 0
        corrupt = 0
        failure: PullFailure | None = None
        reason = ""
        assembler = BlockAssembler(wanted)
        timeout = max(0.0, attempt.timeout_s)
        call = self._stub(attempt.remote_address).PullBlocks(request, timeout=timeout, metadata=self._metadata)
        try:
            # The asyncio timeout backs up gRPC's: it also bounds time spent in
            # interceptors (the link model) before the call reaches the wire.
            async with asyncio.timeout(timeout + 0.05):
                async for chunk in call:
                    for piece in chunk.pieces:
                        try:
                            complete = assembler.feed(piece)
                        except ChecksumMismatch:
                            corrupt += 1
                            continue
                        if complete is None:
                            continue
                        position, data = complete
                        index = attempt.block_indices[position]
                        try:
                            outcome = on_block(attempt, index, data)
                            if inspect.isawaitable(outcome):
                                await outcome
                        except Exception as err:  # the consumer refused the block
                            failure, reason = PullFailure.SINK_ERROR, f"{type(err).__name__}: {err}"
                            break
                        landed.append(index)
                        num_bytes += len(data)
                    if failure is not None:
                        break
        except grpc.aio.AioRpcError as err:
            code = err.code()
            failure = FINAL_CODES.get(code) or RETRYABLE_CODES.get(code, PullFailure.PRODUCER_ERROR)
            reason = f"{code.name}: {err.details()}"
        except TimeoutError:
            failure, reason = PullFailure.DEADLINE_EXCEEDED, f"attempt timed out after {timeout:g} s"
        except ProtocolError as err:
            failure, reason = PullFailure.PROTOCOL_ERROR, str(err)
        finally:
            call.cancel()  # no-op once the call has finished
        if failure is None and len(landed) < len(wanted):
            if corrupt:
                failure = PullFailure.CHECKSUM_MISMATCH
                reason = f"{corrupt} block(s) arrived corrupt"
            else:
                failure, reason = PullFailure.PROTOCOL_ERROR, "stream ended with blocks missing"
        elif len(landed) == len(wanted):
            # Every block is in: whatever went wrong after that (a late status,
            # a stray piece) costs nothing.
            failure, reason = None, ""
        return PullAttemptResult(
            attempt=attempt,
            landed=tuple(landed),
            failure=failure,
            reason=reason,
            num_bytes=num_bytes,
            checksum_failures=corrupt,
        )

    async def report(self, report: DoneReport) -> DoneReportResult:
        """One ReportDone call, bounded by `report.timeout_s`. Never raises for
        a gRPC status or a timeout: `delivered` when acknowledged, `final` when
        the producer refused it (a FINAL_CODES status: retrying cannot help)."""
        timeout = max(0.0, report.timeout_s)
        request = pb.DoneRequest(
            request_id=report.remote_request_id,
            success=report.success,
            consumer_id=report.consumer_id or self.config.consumer_id,
            reason=report.reason[:256],
            ticket=report.ticket,
        )
        try:
            async with asyncio.timeout(timeout + 0.05):
                await self._stub(report.remote_address).ReportDone(request, timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as err:
            return DoneReportResult(report, delivered=False, final=err.code() in FINAL_CODES)
        except TimeoutError:
            return DoneReportResult(report, delivered=False)
        return DoneReportResult(report, delivered=True)

    # -- whole pulls -----------------------------------------------------------

    async def pull(
        self,
        request_id: str,
        remote_address: str,
        remote_block_ids: Sequence[int],
        local_block_ids: Sequence[int],
    ) -> PullResult:
        """Pull `remote_block_ids` of `request_id` from `remote_address` into the
        sink as `local_block_ids` (same length, paired by position), retrying
        under the shared policy (`connector.pull_policy`)."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"pull: request_id must be a non-empty str, got {request_id!r}")
        remote = _validate_block_ids("remote_block_ids", remote_block_ids)
        local = _validate_block_ids("local_block_ids", local_block_ids)
        if len(remote) != len(local) or not remote:
            raise ValueError(
                f"pull: remote_block_ids ({len(remote)}) and local_block_ids ({len(local)}) "
                "must be non-empty and of equal length"
            )
        if self.sink is None:
            raise RuntimeError("pull: this KVPuller has no sink (use attempt() with an on_block)")
        self._stub(remote_address)  # opened in call order (see _stub)
        spec = RecvSpec(
            request_id=request_id,
            local_block_ids=local,
            remote_block_ids=remote,
            remote_request_id=request_id,
            remote_engine_id="",
            remote_address=remote_address,
            num_tokens=0,
        )
        async with self._slots:
            return await self._run(spec)

    async def _run(self, spec: RecvSpec) -> PullResult:
        sink = self.sink
        assert sink is not None

        def write(attempt: PullAttempt, index: int, data: bytes) -> None | Awaitable[None]:
            return sink.write_block(spec.local_block_ids[index], attempt.request_id, index, data)

        started = time.monotonic()
        session = PullSession(spec, self._policy, started, consumer_id=self.config.consumer_id)
        while True:
            step = session.next_attempt(time.monotonic())
            if isinstance(step, Failed):
                decision: Landed | Failed = step
                break
            outcome = session.record(await self.attempt(step, write), time.monotonic())
            if isinstance(outcome, Retry):
                await asyncio.sleep(max(0.0, outcome.at - time.monotonic()))
                continue
            decision = outcome
            break
        transfer_done = time.monotonic()
        if isinstance(decision, Failed):
            self._report_failure_later(spec, f"{decision.failure.value}: {decision.reason}")
            return self._result(
                session, started, transfer_done, ok=False, failure=decision.failure, reason=decision.reason
            )
        done_reported = self.config.report_done and await self._report_done(spec)
        return self._result(session, started, transfer_done, ok=True, done_reported=done_reported)

    # -- done reports ----------------------------------------------------------

    async def _report_done(self, spec: RecvSpec) -> bool:
        """ReportDone(success) under DoneSession: until acknowledged, refused,
        or deadline_s after the first report (which always goes out)."""
        session = DoneSession(
            spec.remote_request_id,
            spec.remote_address,
            True,
            self._policy,
            time.monotonic(),
            consumer_id=self.config.consumer_id,
        )
        while True:
            result = await self.report(session.next_report(time.monotonic()))
            if result.delivered:
                return True
            retry = session.record(result, time.monotonic())
            if retry is None:
                return False
            await asyncio.sleep(max(0.0, retry.at - time.monotonic()))

    def _report_failure_later(self, spec: RecvSpec, reason: str) -> None:
        """One best-effort ReportDone(success=False), without delaying the result
        (the producer frees the blocks on its own hold timeout otherwise)."""
        if not self.config.report_done:
            return
        session = DoneSession(
            spec.remote_request_id,
            spec.remote_address,
            False,
            self._policy,
            time.monotonic(),
            consumer_id=self.config.consumer_id,
            reason=reason,
        )
        task = asyncio.ensure_future(self.report(session.next_report(time.monotonic())))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- results ---------------------------------------------------------------

    @staticmethod
    def _result(
        session: PullSession,
        started: float,
        transfer_done: float,
        *,
        ok: bool,
        failure: PullFailure | None = None,
        reason: str = "",
        done_reported: bool = False,
    ) -> PullResult:
        now = time.monotonic()
        return PullResult(
            request_id=session.spec.request_id,
            ok=ok,
            failure=failure,
            reason=reason,
            num_blocks=len(session.spec.remote_block_ids) - len(session.missing),
            num_bytes=session.num_bytes,
            attempts=session.attempts,
            checksum_failures=session.checksum_failures,
            done_reported=done_reported,
            transfer_s=transfer_done - started,
            total_s=now - started,
        )
