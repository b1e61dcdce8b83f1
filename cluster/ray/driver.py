"""The load driver and client of the Ray runtime, in the driver process.

It releases the workload's requests at their arrival times (run seconds) to
the proxy — all at once, or closed-loop with at most `max_concurrency` in
flight — and reads the proxy's client stream, building one `RequestRecord`
per request from the streamed events (times as the proxy stamped them).

A watchdog ends the run when nothing has been heard for `stall_timeout_s`
while requests are outstanding, or at the hard `timeout_s`: the run then
reports those requests as not terminal instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from cluster.wall.clock import RunClock
from engine.records import RequestRecord, WorkloadRequest
from proxy.client import Arrived, ClientEvent, Finished, Submission, apply_to_record

from .handles import ActorRef

logger = logging.getLogger(__name__)

Progress = Callable[[dict], None]
# (node that served it, its record) for each request finished in one batch of client events.
OnFinished = Callable[[list[tuple[str, RequestRecord]]], None]


class LoadDriver:
    def __init__(
        self,
        submit: Callable[[list[Submission]], None],
        workload: list[WorkloadRequest],
        clock: RunClock,
        max_concurrency: int | None = None,
        progress: Progress | None = None,
        on_finished: OnFinished | None = None,
    ) -> None:
        """`submit(batch)` hands `Submission`s to the proxy; client events
        come back through `handle`.
        `on_finished` hears of finished requests (live metrics)."""
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency} is invalid; allowed: >= 1 or None (open loop)")
        self.submit = submit
        self.workload = sorted(workload, key=lambda w: (w.arrival_time, w.request_id))
        self.by_id = {w.request_id: w for w in workload}
        self.clock = clock
        self.max_concurrency = max_concurrency
        self.progress = progress
        self.on_finished = on_finished
        self.records: dict[str, RequestRecord] = {}
        self.released: set[str] = set()
        self.finished = 0
        self.in_flight = 0
        self.last_event = 0.0
        self.stalled = False
        self.timed_out = False
        self._backlog: list[WorkloadRequest] = []
        self._all_done = asyncio.Event()
        self._room = asyncio.Event()
        if not workload:
            self._all_done.set()

    # -- releasing --------------------------------------------------------------
    async def release_all(self) -> None:
        i, n = 0, len(self.workload)
        while i < n:
            await self.clock.sleep_until(self.workload[i].arrival_time)
            now = self.clock.now()
            due = []
            while i < n and self.workload[i].arrival_time <= now:
                due.append(self.workload[i])
                i += 1
            self._backlog.extend(due)
            self._release_backlog()

    def _release_backlog(self) -> None:
        batch = []
        while self._backlog and (self.max_concurrency is None or self.in_flight < self.max_concurrency):
            w = self._backlog.pop(0)
            self.released.add(w.request_id)
            self.in_flight += 1
            batch.append(Submission.of(w))
        if batch:
            self.last_event = self.clock.now()  # the stall watchdog counts from here
            self.submit(batch)

    def _free_slot_at(self, t: float) -> None:
        """A finished request's slot frees when its client sees the finish: at
        `t`, its stamped time, which the API server's streaming of the last
        chunk can put after the event reached the driver. A closed-loop client
        sends its next request only then (as in-process: cluster/inproc/records.py)."""
        delay = t - self.clock.now()
        if delay <= 0 or self.max_concurrency is None:
            self.in_flight -= 1
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # driven by hand, without a loop: nothing can wait
            self.in_flight -= 1
            return
        loop.call_later(delay, self._free_slot)

    def _free_slot(self) -> None:
        self.in_flight -= 1
        self._release_backlog()

    # -- the client stream ----------------------------------------------------------
    async def consume(self, stream: AsyncIterator[ActorRef]) -> None:
        """The proxy's `stream` (a Ray streaming generator): a ref per batch of client events."""
        async for ref in stream:
            self.handle(await ref)

    def handle(self, events: list[ClientEvent]) -> None:
        self.last_event = self.clock.now()
        records = self.records
        finished: list[tuple[str, RequestRecord]] = []
        for ev in events:
            if isinstance(ev, Arrived):
                w = self.by_id[ev.request_id]
                records[ev.request_id] = RequestRecord(ev.request_id, ev.time, w.prompt_len, w.output_len, w.priority)
                continue
            rec = records.get(ev.request_id)
            if rec is not None and apply_to_record(rec, ev):
                assert isinstance(ev, Finished)
                self.finished += 1
                finished.append((ev.node, rec))
                self._free_slot_at(ev.time)
        if finished and self.on_finished is not None:
            self.on_finished(finished)
        if finished:
            self._release_backlog()
            if self.progress is not None:
                self.progress({"finished": self.finished, "total": len(self.workload), "time": self.last_event})
            if self.finished >= len(self.workload):
                self._all_done.set()

    # -- waiting ----------------------------------------------------------------------
    async def wait_done(self, stall_timeout_s: float, timeout_s: float | None) -> bool:
        """True when every request finished; False when the watchdog ended the run."""
        start = self.clock.now()
        while not self._all_done.is_set():
            try:
                await asyncio.wait_for(self._all_done.wait(), 0.25)
            except TimeoutError:
                pass
            now = self.clock.now()
            if timeout_s is not None and now - start > timeout_s:
                self.timed_out = True
                logger.error(
                    "run timed out after %.1f s with %d of %d requests finished",
                    now - start,
                    self.finished,
                    len(self.workload),
                )
                return False
            if self.in_flight > 0 and now - self.last_event > stall_timeout_s:
                self.stalled = True
                logger.error(
                    "run stalled: nothing heard for %.1f s with %d request(s) in flight",
                    now - self.last_event,
                    self.in_flight,
                )
                return False
        return True
