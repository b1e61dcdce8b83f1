"""One direction of an impaired link in wall time, for the application-level
links (proxy <-> nodes, stage -> stage): items go in, come out in FIFO order
after the `DelayLine`'s transit, and those due together are delivered as one
batch. These links are TCP connections: a message the link model drops is
retransmitted (`connector.link.ReliableLine`), so loss shows up as delay and
never reorders (as in-process). If an outage outlasts the retransmissions,
the connection is broken: `on_broken` is called and the mailbox stops."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from connector.link import DelayLine, ReliableLine

from .clock import RunClock

logger = logging.getLogger(__name__)

T = TypeVar("T")


class DelayedMailbox(Generic[T]):
    def __init__(
        self,
        clock: RunClock,
        line: DelayLine | None,
        deliver: Callable[[list[T]], None],
        on_broken: Callable[[], None] | None = None,
    ) -> None:
        self.clock = clock
        self.line = None if line is None else ReliableLine(line)
        self.deliver = deliver
        self.on_broken = on_broken
        self.broken = False
        self._queue: deque[tuple[float, T]] = deque()
        self._last = 0.0
        self._wakeup = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def put(self, item: T, nbytes: int) -> None:
        if self.broken:
            return
        now = self.clock.now()
        arrival = now if self.line is None else self.line.transit(now, nbytes)
        if arrival is None:
            self.broken = True
            logger.error("link broken: an outage outlasted the retransmissions")
            if self.on_broken is not None:
                self.on_broken()
            return
        self._last = max(self._last, arrival)
        self._queue.append((self._last, item))
        self._wakeup.set()

    async def _run(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self.clock.sleep_until(queue[0][0])
            now = self.clock.now()
            batch = []
            while queue and queue[0][0] <= now:
                batch.append(queue.popleft()[1])
            if batch:
                try:
                    self.deliver(batch)
                except Exception:  # one bad batch must not stop the link
                    logger.exception("delivery failed")

    def close(self) -> None:
        self._task.cancel()
