"""The in-process load driver: releases each workload request to the proxy
at its arrival time, open loop, or closed loop at `max_concurrency`
(a request over the limit waits in a backlog until one in flight finishes)."""

from __future__ import annotations

from collections.abc import Iterable

from engine.records import WorkloadRequest
from proxy.client import Submission
from proxy.proxy import Proxy

from .clock import EventLoop
from .records import ClientRecords


class LoadDriver:
    def __init__(self, loop: EventLoop, proxy: Proxy, records: ClientRecords) -> None:
        self.loop = loop
        self.proxy = proxy
        self.records = records
        records.on_finish = self._finished
        self.backlog: list[WorkloadRequest] = []
        self.in_flight = 0
        self.max_concurrency: int | None = None

    def submit(self, workload: Iterable[WorkloadRequest], max_concurrency: int | None = None) -> None:
        self.max_concurrency = max_concurrency
        workload = list(workload)
        seen = set(self.records.workload)
        for w in workload:
            if w.request_id in seen:
                raise ValueError(f"duplicate request id {w.request_id!r} in the workload")
            seen.add(w.request_id)
        for w in workload:
            self.records.expect(w)
        # Known up front: the loop keeps them apart from what the run schedules (clock.py).
        self.loop.at_each([w.arrival_time for w in workload], self.arrive, [(w,) for w in workload])

    def arrive(self, w: WorkloadRequest) -> None:
        if self.max_concurrency is not None and self.in_flight >= self.max_concurrency:
            self.backlog.append(w)
            return
        self.in_flight += 1
        self.proxy.submit([Submission.of(w)])

    def _finished(self, seen: float) -> None:
        """A request finished; its client sees that at `seen` (the API
        server streams the last chunk after the proxy has it), and only
        then has a free slot for the next request."""
        if seen > self.loop.now():
            self.loop.at(seen, self._free_slot)
        else:
            self._free_slot()

    def _free_slot(self) -> None:
        self.in_flight -= 1
        if self.backlog:
            self.arrive(self.backlog.pop(0))
