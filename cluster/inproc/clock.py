"""A discrete-event loop on a virtual clock: deterministic, single-threaded,
and the `node.ports.Clock` the in-process runtime gives every node. Events
due at the same time run in the order they were scheduled.

Events known in bulk up front (a workload's arrivals: `at_each`) wait in a
sorted queue of their own next to the heap, so the heap holds only what the
run itself schedules (a handful of events, not every arrival to come) and
each push and pop stays cheap. The two are merged by (time, order of
scheduling): the order is the one a single heap gives."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from operator import itemgetter
from typing import Any


class VirtualTimer:
    __slots__ = ("cancelled", "_loop")

    def __init__(self, loop: EventLoop | None = None) -> None:
        self.cancelled = False
        self._loop = loop

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self._loop is not None:
                self._loop._timer_cancelled()


class EventLoop:
    def __init__(self) -> None:
        self._now = 0.0
        self._heap: list[tuple[float, int, Callable, tuple]] = []
        # Events scheduled in bulk (`at_each`), sorted by (time, seq).
        self._sorted: deque[tuple[float, int, Callable, tuple]] = deque()
        self._seq = 0
        self.num_events = 0
        # Cancelled timers still in the heap (they stay until their time, or
        # until they are the majority: `_timer_cancelled`).
        self._cancelled = 0

    # -- the Clock port ----------------------------------------------------------
    def now(self) -> float:
        return self._now

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self._now, fn, *args)

    def call_at(self, t: float, fn: Callable[..., Any], *args: Any) -> VirtualTimer:
        timer = VirtualTimer(self)
        self.at(t, self._fire, timer, fn, args)
        return timer

    def _timer_cancelled(self) -> None:
        """A timer in the heap was cancelled. When most of the heap is
        cancelled timers (a prefill node's hold timers, cancelled by the done
        report long before they are due), they go: they run nothing and move
        no clock, and `first_live` would otherwise pass over all of them."""
        self._cancelled += 1
        heap = self._heap
        if self._cancelled > 64 and 2 * self._cancelled > len(heap):
            fire = self._fire
            heap[:] = [e for e in heap if e[2] is not fire or not e[3][0].cancelled]
            heapq.heapify(heap)
            self._cancelled = 0

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

    def at_each(self, times: list[float], fn: Callable[..., Any], args: list[tuple]) -> None:
        """`at(times[i], fn, *args[i])` for each i in turn, kept in the sorted
        queue (see the module's docstring)."""
        if len(times) != len(args):
            raise ValueError(f"at_each: {len(times)} times for {len(args)} argument tuples")
        now, seq = self._now, self._seq
        events = [(t if t >= now else now, seq + i, fn, a) for i, (t, a) in enumerate(zip(times, args), 1)]
        self._seq = seq + len(events)
        events.sort(key=itemgetter(0))  # stable: equal times keep their order of scheduling
        # In place: `run` holds this deque while it runs (a handler may schedule more).
        merged = list(heapq.merge(self._sorted, events)) if self._sorted else events
        self._sorted.clear()
        self._sorted.extend(merged)

    def run(self, until: float | None = None, max_events: int | None = None) -> None:
        heap, ordered = self._heap, self._sorted
        fire = self._fire
        heappop, popleft = heapq.heappop, ordered.popleft
        horizon = math.inf if until is None else until
        budget = math.inf if max_events is None else max_events
        # The count is kept in a local while the loop runs (nothing reads it
        # meanwhile) and written back however the loop ends.
        n = self.num_events
        try:
            while True:
                # The next event: the earlier of the two queues' heads, by
                # (time, seq) (seqs are unique, so functions are never compared).
                if heap:
                    event = heap[0]
                    if ordered and ordered[0] < event:
                        event = ordered[0]
                        if event[0] > horizon:
                            break
                        popleft()
                    else:
                        if event[2] is fire and event[3][0].cancelled:
                            heappop(heap)  # a cancelled timer: time does not move for it
                            self._cancelled -= 1
                            continue
                        if event[0] > horizon:
                            break
                        heappop(heap)
                elif ordered:
                    event = ordered[0]
                    if event[0] > horizon:
                        break
                    popleft()
                else:
                    break
                self._now = event[0]
                event[2](*event[3])
                n += 1
                if n >= budget:
                    raise RuntimeError(
                        f"event budget of {max_events} exhausted at t={self._now:.3f}s: the run does not converge"
                    )
        finally:
            self.num_events = n

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
            self._cancelled -= 1
        first = min(heap[:1] + list(itertools.islice(self._sorted, 1)), default=None)
        return None if first is None else first[0]

    def first_live(self, k: int) -> list[tuple[float, int, Callable, tuple]]:
        """The `k` earliest events that will run (fewer if there are not
        that many), in order, without taking them off the queue; cancelled
        timers are passed over. A best-first walk of the heap from its root:
        it reads only the entries that come before the `k`th live one and
        their children."""
        heap, fire = self._heap, self._fire
        ahead = list(itertools.islice(self._sorted, k))  # the sorted queue's first k
        # The heap's entries after the sorted queue's kth cannot be among the
        # first k: the walk stops there (it would otherwise pass over every
        # cancelled timer when few live events are in the heap).
        limit = ahead[-1] if len(ahead) == k else None
        out: list[tuple[float, int, Callable, tuple]] = []
        if heap and (limit is None or heap[0] < limit):
            n = len(heap)
            heappush, heappop = heapq.heappush, heapq.heappop
            frontier = [(heap[0], 0)]  # entries are unique by (time, seq): functions are never compared
            while frontier and len(out) < k:
                event, i = heappop(frontier)
                if event[2] is not fire or not event[3][0].cancelled:
                    out.append(event)
                # Children past the limit cannot be among the first k: not walked.
                child = 2 * i + 1
                if child < n and (limit is None or heap[child] < limit):
                    heappush(frontier, (heap[child], child))
                child += 1
                if child < n and (limit is None or heap[child] < limit):
                    heappush(frontier, (heap[child], child))
        if ahead:
            out = sorted(out + ahead)[:k]  # at most 2k entries, unique by (time, seq)
        return out

    @property
    def pending(self) -> int:
        return len(self._heap) + len(self._sorted)
