"""The run clock of the Ray runtime: seconds since the run started.

Every process of a run (driver, proxy, nodes, stage workers) is told the
run's start as a `time.time()` value and maps it once onto its own
`time.monotonic()` clock, which is what asyncio sleeps on. Times then agree
across processes on one machine to microseconds, and across machines to the
accuracy of their NTP sync, while sleeps stay immune to wall-clock steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# The last stretch of a sleep is slept in a thread (time.sleep is precise to
# ~0.1 ms); what comes before it on asyncio's coarse timer.
THREAD_TAIL_S = 0.002
# The wake-up delay estimate: an exponential moving average, and its cap.
LATENESS_GAIN = 0.1
MAX_LATENESS_S = 0.0005
_sleepers: ThreadPoolExecutor | None = None


def _sleeper_pool() -> ThreadPoolExecutor:
    global _sleepers
    if _sleepers is None:
        _sleepers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="run-clock")
    return _sleepers


class RunClock:
    def __init__(self, epoch_monotonic: float) -> None:
        # The time.monotonic() value of the run's t = 0 in this process.
        self.epoch = epoch_monotonic
        # How late the loop resumes after a precise sleep (thread hand-off and
        # loop wake-up), learnt as a moving average and slept off in advance.
        self.lateness = 0.0

    @classmethod
    def from_wall_start(cls, start_wall: float) -> RunClock:
        return cls(time.monotonic() - (time.time() - start_wall))

    @classmethod
    def starting_now(cls) -> RunClock:
        return cls(time.monotonic())

    def now(self) -> float:
        return time.monotonic() - self.epoch

    async def sleep_until(self, t: float) -> None:
        """Sleep until run time `t` (at once if it has passed).

        asyncio's timers fire up to 1 ms late: epoll waits whole
        milliseconds, rounded up, so a 0.3 ms sleep takes ~1 ms. So the last
        `THREAD_TAIL_S` of a sleep is slept in a helper thread, which wakes
        the loop ~0.2 ms after `t` (measured here) for the price of one
        thread hand-off, and no busy waiting; that systematic delay is
        learnt and slept off in advance, so wake-ups land on `t` on average.
        Callers that chain sleeps
        compute each deadline from the previous deadline, not from when they
        woke, so lateness does not accumulate.
        """
        delay = t - self.now()
        if delay <= 0:
            return
        if delay > THREAD_TAIL_S:
            await asyncio.sleep(delay - THREAD_TAIL_S)
        deadline = self.epoch + t
        early = deadline - self.lateness
        if early > time.monotonic():
            await asyncio.get_running_loop().run_in_executor(
                _sleeper_pool(), lambda: time.sleep(max(0.0, early - time.monotonic()))
            )
            # Learn the systematic wake-up delay (clamped: a stall of the whole
            # machine is not something to anticipate).
            late = min(max(time.monotonic() - early, 0.0), MAX_LATENESS_S)
            self.lateness += LATENESS_GAIN * (late - self.lateness)


class WallClock:
    """The `node.ports.Clock` of a node on asyncio: run seconds on a `RunClock`.
    Timers ride asyncio's own (they fire up to ~1 ms late, which the fault
    policy's timeouts and backoffs do not mind); steps and links that need
    sub-millisecond wake-ups sleep on `RunClock.sleep_until` instead."""

    def __init__(self, run_clock: RunClock | None = None) -> None:
        self.run_clock = run_clock or RunClock.starting_now()

    def start(self, start_wall: float) -> None:
        """Put t = 0 at `start_wall` (a time.time() value shared by every process of the run)."""
        self.run_clock = RunClock.from_wall_start(start_wall)

    def now(self) -> float:
        return self.run_clock.now()

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        asyncio.get_running_loop().call_soon(fn, *args)

    def call_at(self, t: float, fn: Callable[..., object], *args: Any) -> asyncio.TimerHandle:
        # The loop's clock is time.monotonic(), as the run clock's epoch is.
        return asyncio.get_running_loop().call_at(self.run_clock.epoch + t, fn, *args)
