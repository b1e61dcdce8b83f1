"""`GrpcKVTransport`: the `KVTransport` port (connector/transport.py) over gRPC.

The decode node drives it from plain synchronous code running on the event
loop: `pull` and `report_done` start a task and return at once; the task
runs one `KVPuller.attempt` / `KVPuller.report` and hands its outcome to
`on_result` exactly once (unless the transport is closed first). Retries,
backoff and deadlines are the node's (`connector.pull_policy`).

    transport = GrpcKVTransport(link=None, link_seed=0, link_epoch=time.monotonic(), consumer_id="decode-0")
    transport.pull(attempt, on_block, on_result)      # on the loop, not awaited
    ...
    await transport.close()
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from connector.kv_timing import NO_KV_TIMING, KVContacts, KVTransferTiming
from connector.link import Link, LinkSpec
from connector.transport import (
    DoneReport,
    DoneReportResult,
    OnBlock,
    PullAttempt,
    PullAttemptResult,
    PullFailure,
)

from .client import KVPuller
from .pull_config import PullerConfig
from .security import KVSecurity
from .wire import MAX_MESSAGE_BYTES

logger = logging.getLogger(__name__)


class GrpcKVTransport:
    """A consumer's `KVTransport` on gRPC: single attempts, no retry policy.

    One channel per producer address (opened on first use, impaired by
    `link` if given, seeded from `link_seed`; outage windows count from
    `link_epoch`, a time.monotonic() value). All calls on one event loop.
    """

    def __init__(
        self,
        *,
        link: LinkSpec | None = None,
        link_seed: int = 0,
        link_epoch: float | None = None,
        consumer_id: str = "",
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        security: KVSecurity | None = None,
        timing: KVTransferTiming = NO_KV_TIMING,
        time_scale: float = 1.0,
    ) -> None:
        # The connector's own terms (connector/kv_timing.py), slept on this
        # loop's clock: the handshake and metadata before an attempt, the
        # transfer's after its blocks are in (not counted against the
        # attempt's timeout here; in-process an attempt they push past it fails).
        self._timing = timing.scaled(time_scale)
        self._timed = not timing.is_free
        self._contacts = KVContacts()
        config = PullerConfig(consumer_id=consumer_id, max_message_bytes=max_message_bytes)
        self._puller = KVPuller(None, config, link=link, link_seed=link_seed, link_epoch=link_epoch, security=security)
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    def set_link_epoch(self, epoch: float) -> None:
        """Where outage windows count from (a time.monotonic() value): the
        run's t = 0, known only once the run starts. Before the first pull."""
        self._puller.set_link_epoch(epoch)

    @property
    def in_flight(self) -> int:
        """Attempts and done reports started and not yet reported."""
        return len(self._tasks)

    def link_for(self, address: str) -> Link | None:
        """The link model impairing the channel to `address`, if any (for its counters)."""
        return self._puller.link_for(address)

    # -- the port ----------------------------------------------------------------

    def pull(self, attempt: PullAttempt, on_block: OnBlock, on_result: Callable[[PullAttemptResult], None]) -> None:
        """Start one attempt; `on_result` gets its outcome once, within about
        `attempt.timeout_s`."""
        self._spawn(self._pull(attempt, on_block, on_result), f"kv-pull {attempt.request_id}#{attempt.number}")

    def report_done(self, report: DoneReport, on_result: Callable[[DoneReportResult], None]) -> None:
        """Send one done report; `on_result` gets its outcome once."""
        self._spawn(self._report(report, on_result), f"kv-done {report.remote_request_id}#{report.number}")

    async def close(self) -> None:
        """Cancel what is in flight (its `on_result` is not called) and close the channels."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._puller.close()

    async def __aenter__(self) -> GrpcKVTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- tasks -------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        if self._closed:
            coro.close()
            raise RuntimeError("GrpcKVTransport: closed")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pull(
        self, attempt: PullAttempt, on_block: OnBlock, on_result: Callable[[PullAttemptResult], None]
    ) -> None:
        landed: list[int] = []
        num_bytes = 0

        def deliver(attempt: PullAttempt, index: int, data: bytes) -> None:
            nonlocal num_bytes
            on_block(attempt, index, data)
            landed.append(index)
            num_bytes += len(data)

        try:
            if self._timed:
                now = asyncio.get_running_loop().time()
                start = self._contacts.start_at(self._timing, attempt.remote_address, attempt.request_id, now)
                if start > now:
                    await asyncio.sleep(start - now)
            result = await self._puller.attempt(attempt, deliver)
            if self._timed and result.failure is None and result.landed:
                await asyncio.sleep(self._timing.transfer_s(len(attempt.block_indices), result.num_bytes))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug or an unforeseen error: still one result
            logger.exception("kv pull attempt %s #%d raised", attempt.request_id, attempt.number)
            result = PullAttemptResult(
                attempt,
                landed=tuple(landed),
                failure=PullFailure.PRODUCER_ERROR,
                reason=f"{type(err).__name__}: {err}",
                num_bytes=num_bytes,
            )
        self._call(on_result, result)

    async def _report(self, report: DoneReport, on_result: Callable[[DoneReportResult], None]) -> None:
        try:
            result = await self._puller.report(report)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("kv done report for %s raised", report.remote_request_id)
            result = DoneReportResult(report, delivered=False)
        self._call(on_result, result)

    @staticmethod
    def _call(on_result: Callable[[Any], None], result: Any) -> None:
        # The callback is the node's: an error in it is a bug there, logged
        # here because a task has no caller to raise it to.
        try:
            on_result(result)
        except Exception:
            logger.exception("kv transport: on_result raised for %r", result)
