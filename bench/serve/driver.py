"""The in-process cluster driven by the wall clock, for `disagg-sim serve`.

The cluster keeps its virtual clock and its discrete events (the very code a
`disagg-sim run` executes); this driver holds that clock to the wall clock:
virtual time = (wall seconds since start) / `time_scale`. With the default
`time_scale` 1, one modelled second takes one real second, so a client's
TTFT is the simulator's. With `time_scale` 2 the modelled GPU runs at half
speed (every latency a client sees doubles); below 1 it runs faster than
real time. Link delays, timeouts and the KV fault policy are in virtual
seconds too, so they scale with it.

Everything runs on one asyncio loop in one thread: HTTP handlers submit and
abort between event batches, and the driver wakes at the next event's due
time, or at once when a request arrives. After each batch it wakes only the
handlers of the requests the batch touched (`InProcCluster.touched`), not
every request in flight. When the machine cannot keep up
(the events due take longer to run than the time they cover), virtual time
falls behind: the records keep the modelled times, clients see them late.
`lag_s` reports the worst lateness so far.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from cluster.inproc import InProcCluster
from cluster.spec import ClusterSpec
from engine.records import RequestRecord, WorkloadRequest

from .streams import KEEP_STEPS, TRIM_EVERY, ServeDriver, Stream

__all__ = ["KEEP_STEPS", "TRIM_EVERY", "PacedCluster", "Stream"]


class PacedCluster(ServeDriver):
    runtime = "inproc"

    def __init__(
        self,
        spec: ClusterSpec,
        seed: int = 0,
        time_scale: float = 1.0,
        max_pending: int = 512,
        observer=None,
        keep_records: int = 1_000,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale={time_scale!r} is invalid; allowed: > 0")
        # A request must fit every node it may visit.
        max_model_len = min(g.engine.max_model_len for g in (spec.prefill, spec.decode) if g.count)
        super().__init__(max_model_len, max_pending, keep_records)
        self.cluster = InProcCluster(spec, seed=seed, observer=observer)
        self._touched: set[str] = set()
        self.cluster.touched = self._touched
        self.time_scale = time_scale
        self._start = time.monotonic()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.lag_s = 0.0
        self._forgotten = 0

    # -- time ---------------------------------------------------------------------------
    def virtual_now(self) -> float:
        return (time.monotonic() - self._start) / self.time_scale

    def clock_origin(self) -> tuple[float, float]:
        return self._start, self.time_scale

    def start(self) -> None:
        self._start = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._drive())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _drive(self) -> None:
        loop = self.cluster.loop
        while True:
            self.advance()
            nxt = loop.next_time()
            timeout = None if nxt is None else max(0.0, nxt * self.time_scale - (time.monotonic() - self._start))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    def advance(self) -> None:
        """Run every event due by now, then wake the handlers of the requests it touched."""
        now = self.virtual_now()
        loop = self.cluster.loop
        nxt = loop.next_time()
        if nxt is not None and nxt < now:
            self.lag_s = max(self.lag_s, (now - nxt) * self.time_scale)
        loop.advance_to(now)
        touched = self._touched
        if touched:
            self._notify(touched)
            touched.clear()

    # -- the cluster's side of a request -------------------------------------------------
    def _submit(self, w: WorkloadRequest) -> RequestRecord:
        self.advance()
        w = replace(w, arrival_time=self.cluster.loop.now())
        self.cluster.submit([w])
        self.cluster.loop.run(until=self.cluster.loop.now(), max_events=None)  # the arrival itself
        self._wake.set()
        return self.cluster.records[w.request_id]

    def _abort(self, request_id: str) -> None:
        self.advance()
        self.cluster.abort(request_id)
        self._wake.set()

    def _forget(self, request_id: str) -> None:
        self._touched.discard(request_id)
        self.cluster.forget(request_id)
        self._forgotten += 1
        if self._forgotten % TRIM_EVERY == 0:
            # A long-lived server's memory stays flat: nodes drop old step
            # records and what finished requests left (benchmarks/serve_soak.py).
            self.cluster.trim_history(KEEP_STEPS)

    def requests_aborted(self) -> int:
        return self.cluster.requests_aborted

    async def engine_state(self) -> dict[str, dict]:
        return {
            name: {
                "requests": len(node.core.request_ids()),
                "errors": node.core.end_of_run_errors(),
                "counters": node.counters(),
            }
            for name, node in self.cluster.nodes.items()
        }
