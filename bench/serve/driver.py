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
time, or at once when a request arrives. When the machine cannot keep up
(the events due take longer to run than the time they cover), virtual time
falls behind: the records keep the modelled times, clients see them late.
`lag_s` reports the worst lateness so far.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from cluster.inproc import InProcCluster
from cluster.spec import ClusterSpec
from engine.records import RequestRecord, WorkloadRequest

from .protocol import ApiError, ServeRequest
from .tokenizer import segments_for


@dataclass
class Stream:
    """One request's view for its HTTP handler."""

    request_id: str
    record: RequestRecord
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    seen: int = 0  # tokens already announced


class PacedCluster:
    def __init__(
        self,
        spec: ClusterSpec,
        seed: int = 0,
        time_scale: float = 1.0,
        max_pending: int = 512,
        observer=None,
        keep_records: int = 10_000,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale={time_scale!r} is invalid; allowed: > 0")
        self.cluster = InProcCluster(spec, seed=seed, observer=observer)
        self.time_scale = time_scale
        self.max_pending = max_pending
        # A request must fit every node it may visit.
        self.max_model_len = min(g.engine.max_model_len for g in (spec.prefill, spec.decode) if g.count)
        self._start = time.monotonic()
        self._streams: dict[str, Stream] = {}
        self._wake = asyncio.Event()
        self.num_submitted = 0  # request ids are "<cmpl|chatcmpl>-<8 digits>" from this count
        self._task: asyncio.Task | None = None
        self.lag_s = 0.0
        self.rejected_full = 0
        # Finished requests' records, newest last (tests compare them with what clients saw).
        self.finished: deque[RequestRecord] = deque(maxlen=keep_records)

    # -- time ---------------------------------------------------------------------------
    def virtual_now(self) -> float:
        return (time.monotonic() - self._start) / self.time_scale

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
        """Run every event due by now, then tell the handlers what changed."""
        now = self.virtual_now()
        loop = self.cluster.loop
        nxt = loop.next_time()
        if nxt is not None and nxt < now:
            self.lag_s = max(self.lag_s, (now - nxt) * self.time_scale)
        loop.advance_to(now)
        for stream in list(self._streams.values()):
            rec = stream.record
            if len(rec.output_token_ids) != stream.seen or rec.finish_reason is not None:
                stream.changed.set()

    # -- requests ------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def submit(self, req: ServeRequest) -> Stream:
        """Hand a request to the proxy now; 429 when `max_pending` are in flight."""
        if len(self._streams) >= self.max_pending:
            self.rejected_full += 1
            raise ApiError(
                429,
                f"the server has {len(self._streams)} requests in flight, its limit (--max-pending "
                f"{self.max_pending}); retry later",
            )
        self.advance()
        prefix = "chatcmpl" if req.kind == "chat" else "cmpl"
        request_id = f"{prefix}-{self.num_submitted:08d}"
        self.num_submitted += 1
        w = WorkloadRequest(
            request_id=request_id,
            arrival_time=self.cluster.loop.now(),
            prompt_len=len(req.prompt_ids),
            output_len=req.max_tokens,
            priority=req.priority,
            prompt_segments=tuple(segments_for(req.prompt_keys)),
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            stop_token_ids=tuple(req.stop_token_ids),
        )
        self.cluster.submit([w])
        self.cluster.loop.run(until=self.cluster.loop.now(), max_events=None)  # the arrival itself
        stream = self._streams[request_id] = Stream(request_id, self.cluster.records[request_id])
        self._wake.set()
        return stream

    def abort(self, stream: Stream) -> None:
        """The client went away: abort the request in the engine."""
        self.advance()
        self.cluster.abort(stream.request_id)
        self._done(stream)
        self._wake.set()

    def release(self, stream: Stream) -> None:
        """The handler has sent everything: forget the request."""
        self._done(stream)

    def _done(self, stream: Stream) -> None:
        if self._streams.pop(stream.request_id, None) is not None:
            self.finished.append(stream.record)
            self.cluster.forget(stream.request_id)

    # -- state for /health, tests and /metrics ------------------------------------------
    def node_counters(self) -> dict[str, dict]:
        return {name: node.counters() for name, node in self.cluster.nodes.items()}

    def requests_in_engines(self) -> int:
        """Requests any node's scheduler still knows (running, waiting, or held for a pull)."""
        return sum(len(node.core.request_ids()) for node in self.cluster.nodes.values())

    def idle_errors(self) -> list[str]:
        """What a node holds that an idle cluster must not: requests, deferred
        or leaked blocks (`NodeCore.end_of_run_errors`). Empty when idle."""
        return [e for node in self.cluster.nodes.values() for e in node.core.end_of_run_errors()]
