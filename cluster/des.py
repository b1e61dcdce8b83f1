"""A discrete-event loop on a virtual clock: deterministic, single-threaded."""

from __future__ import annotations

import heapq
from typing import Any, Callable


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable, tuple]] = []
        self._seq = 0
        self.num_events = 0

    def at(self, time: float, fn: Callable, *args: Any) -> None:
        if time < self.now:
            time = self.now
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, fn, args))

    def after(self, delay: float, fn: Callable, *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def run(self, until: float | None = None, max_events: int | None = None) -> None:
        heap = self._heap
        while heap:
            time, _, fn, args = heap[0]
            if until is not None and time > until:
                break
            heapq.heappop(heap)
            self.now = time
            fn(*args)
            self.num_events += 1
            if max_events is not None and self.num_events >= max_events:
                raise RuntimeError(f"event budget of {max_events} exhausted at t={self.now:.3f}s: the run does not converge")

    @property
    def pending(self) -> int:
        return len(self._heap)
