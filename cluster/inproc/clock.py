"""A discrete-event loop on a virtual clock: deterministic, single-threaded,
and the `node.ports.Clock` the in-process runtime gives every node. Events
due at the same time run in the order they were scheduled."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class VirtualTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    def __init__(self) -> None:
        self._now = 0.0
        self._heap: list[tuple[float, int, Callable, tuple]] = []
        self._seq = 0
        self.num_events = 0

    # -- the Clock port ----------------------------------------------------------
    def now(self) -> float:
        return self._now

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self._now, fn, *args)

    def call_at(self, t: float, fn: Callable[..., Any], *args: Any) -> VirtualTimer:
        timer = VirtualTimer()
        self.at(t, self._fire, timer, fn, args)
        return timer

    @staticmethod
    def _fire(timer: VirtualTimer, fn: Callable[..., Any], args: tuple) -> None:
        if not timer.cancelled:
            fn(*args)

    # -- scheduling ------------------------------------------------------------------
    def at(self, time: float, fn: Callable[..., Any], *args: Any) -> None:
        if time < self._now:
            time = self._now
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, fn, args))

    def run(self, until: float | None = None, max_events: int | None = None) -> None:
        heap = self._heap
        fire = self._fire
        while heap:
            time, _, fn, args = heap[0]
            if fn is fire and args[0].cancelled:
                heapq.heappop(heap)  # a cancelled timer: time does not move for it
                continue
            if until is not None and time > until:
                break
            heapq.heappop(heap)
            self._now = time
            fn(*args)
            self.num_events += 1
            if max_events is not None and self.num_events >= max_events:
                raise RuntimeError(
                    f"event budget of {max_events} exhausted at t={self._now:.3f}s: the run does not converge"
                )

    def advance_to(self, t: float) -> None:
        """Run every event due by `t`, then move the clock to `t` (a wall-paced
        driver: what arrives next arrives now, not at the last event's time)."""
        self.run(until=t)
        if t > self._now:
            self._now = t

    def next_time(self) -> float | None:
        """When the next live event is due (None: nothing scheduled). A
        wall-clock driver (`bench/serve/`) sleeps until then."""
        heap = self._heap
        while heap and heap[0][2] is self._fire and heap[0][3][0].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def first_live(self, k: int) -> list[tuple[float, int, Callable, tuple]]:
        """The `k` earliest events that will run (fewer if there are not
        that many), in order, without taking them off the queue; cancelled
        timers are passed over. A best-first walk of the heap from its root:
        it reads only the entries that come before the `k`th live one and
        their children."""
        heap, fire = self._heap, self._fire
        out: list[tuple[float, int, Callable, tuple]] = []
        if not heap:
            return out
        n = len(heap)
        frontier = [(heap[0], 0)]  # entries are unique by (time, seq): functions are never compared
        while frontier and len(out) < k:
            event, i = heapq.heappop(frontier)
            if event[2] is not fire or not event[3][0].cancelled:
                out.append(event)
            for child in (2 * i + 1, 2 * i + 2):
                if child < n:
                    heapq.heappush(frontier, (heap[child], child))
        return out

    @property
    def pending(self) -> int:
        return len(self._heap)
