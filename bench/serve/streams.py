"""What both serve drivers share: requests in flight as `Stream`s, the
front door's limit (`max_pending`, a 429 beyond it), request ids, the
finished records kept for tests, and waking only the handlers whose
request changed.

A driver hands a request to its cluster and keeps its `RequestRecord`
current; the HTTP handlers (`app.py`) read that record. Two drivers:
`driver.PacedCluster` (the in-process cluster on the wall clock) and
`ray_front.RouterDriver` (the Ray runtime's proxy, in the proxy actor).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.records import RequestRecord, WorkloadRequest

from .protocol import ApiError, ServeRequest
from .tokenizer import segments_for

# A long-lived server's memory stays flat: every TRIM_EVERY requests done,
# each node keeps its last KEEP_STEPS step records (nothing in serve reads
# older ones) and forgets what finished requests left (NodeCore.trim_history).
TRIM_EVERY = 256
KEEP_STEPS = 256


@dataclass
class Stream:
    """One request's view for its HTTP handler."""

    request_id: str
    record: RequestRecord
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    seen: int = 0  # tokens already announced
    client_gone: bool = False  # a write found the connection closed


class ServeDriver:
    """The shared part; a runtime's driver implements `_submit`, `_abort`,
    `_forget` and `engine_state`, and calls `_notify` with the ids of the
    requests whose records changed."""

    runtime = ""

    def __init__(self, max_model_len: int, max_pending: int = 512, keep_records: int = 1_000) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending={max_pending!r} is invalid; allowed: >= 1")
        self.max_model_len = max_model_len
        self.max_pending = max_pending
        self._streams: dict[str, Stream] = {}
        self.num_submitted = 0  # request ids are "<cmpl|chatcmpl>-<8 digits>" from this count
        self.rejected_full = 0
        self.client_aborts = 0  # requests aborted because their client went away
        # Finished requests' records, newest last (tests compare them with what clients saw).
        self.finished: deque[RequestRecord] = deque(maxlen=keep_records)

    # -- the runtime's part ----------------------------------------------------------
    def start(self) -> None:
        """On the server's event loop, before the first request."""

    async def stop(self) -> None:
        """On the server's event loop, after the last request."""

    def advance(self) -> None:
        """Bring the records up to now (the in-process clock runs on demand)."""

    def clock_origin(self) -> tuple[float, float]:
        """The run's clock on the wall: (the `time.monotonic()` value of run
        time 0, wall seconds per run second)."""
        raise NotImplementedError

    def _submit(self, w: WorkloadRequest) -> RequestRecord:
        raise NotImplementedError

    def _abort(self, request_id: str) -> None:
        raise NotImplementedError

    def _forget(self, request_id: str) -> None:
        """The request's handler is done with it."""

    def requests_aborted(self) -> int:
        """Requests the cluster's proxy aborted."""
        raise NotImplementedError

    async def engine_state(self) -> dict[str, dict]:
        """Per node: `requests` its scheduler knows, `errors` an idle node must
        not have (`NodeCore.end_of_run_errors`), `counters`."""
        raise NotImplementedError

    # -- the run's clock on the wall ----------------------------------------------------
    def wall_time(self, t: float) -> float:
        """The `time.monotonic()` value at which run time `t` is due."""
        origin, scale = self.clock_origin()
        return origin + t * scale

    async def wait_until(self, t: float) -> None:
        """Return no earlier than run time `t` on the wall (at once if it has
        passed). A record stamps a token with when its client sees it (the
        engine's emit time plus the API server's token side,
        engine/front_end.py), which is later than when the simulation
        produces it: the handler holds each chunk until then, so a client
        measures the stamped TTFT and ITL. asyncio's timers fire late, never
        early (by more than the clock's resolution); the loop makes sure."""
        while (delay := self.wall_time(t) - time.monotonic()) > 0:
            await asyncio.sleep(delay)

    # -- requests ------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def submit(self, req: ServeRequest) -> Stream:
        """Hand a request to the cluster now; 429 when `max_pending` are in flight."""
        if len(self._streams) >= self.max_pending:
            self.rejected_full += 1
            raise ApiError(
                429,
                f"the server has {len(self._streams)} requests in flight, its limit (--max-pending "
                f"{self.max_pending}); retry later",
            )
        prefix = "chatcmpl" if req.kind == "chat" else "cmpl"
        request_id = f"{prefix}-{self.num_submitted:08d}"
        self.num_submitted += 1
        w = WorkloadRequest(
            request_id=request_id,
            arrival_time=0.0,  # the driver stamps it: now on its cluster's clock
            prompt_len=len(req.prompt_ids),
            output_len=req.max_tokens,
            priority=req.priority,
            prompt_segments=tuple(segments_for(req.prompt_keys)),
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            stop_token_ids=tuple(req.stop_token_ids),
        )
        record = self._submit(w)
        stream = self._streams[request_id] = Stream(request_id, record)
        return stream

    def abort(self, stream: Stream) -> None:
        """The client went away: abort the request in the engine."""
        self.client_aborts += 1
        self._abort(stream.request_id)
        self._done(stream)

    def release(self, stream: Stream) -> None:
        """The handler has sent everything: forget the request."""
        self._done(stream)

    def _done(self, stream: Stream) -> None:
        if self._streams.pop(stream.request_id, None) is not None:
            self.finished.append(stream.record)
            self._forget(stream.request_id)

    def _notify(self, request_ids: Iterable[str]) -> None:
        """Wake the handlers of these requests (the ones whose records changed)."""
        streams = self._streams
        for request_id in request_ids:
            stream = streams.get(request_id)
            if stream is not None:
                stream.changed.set()

    # -- questions from tests and tools (`ServerThread.query`, `RayServer.query`) -----
    async def query(self, name: str, *args: Any) -> Any:
        self.advance()
        if name == "last_finished":
            return self.finished[-1] if self.finished else None
        if name == "finished":
            return list(self.finished)
        if name == "counts":
            return {
                "num_submitted": self.num_submitted,
                "in_flight": self.in_flight,
                "rejected_full": self.rejected_full,
                "client_aborts": self.client_aborts,
                "requests_aborted": self.requests_aborted(),
            }
        if name == "engine_state":
            return await self.engine_state()
        if name == "clock_origin":
            return self.clock_origin()
        if name == "set_max_pending":  # tests: a full queue without a second server
            (limit,) = args
            if type(limit) is not int or limit < 1:
                raise ValueError(f"max_pending={limit!r} is invalid; allowed: an integer >= 1")
            self.max_pending = limit
            return None
        raise ValueError(
            f"query {name!r} is unknown; allowed: last_finished, finished, counts, engine_state, clock_origin, "
            "set_max_pending"
        )
