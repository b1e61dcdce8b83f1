"""Pipeline-parallel stages of a decode node, as workers in their own
processes (Ray actors in the cluster adapter), and the node-side executor
that feeds them.

A batch travels stage 0 -> 1 -> ... -> last over framed TCP connections
(`frames.py`). Each stage is busy for its share of the step's scaled
duration; batches queue per stage in arrival order (a stage is free again
`share` after it started, computed from its previous deadline so sleep
overshoot does not add up). Between stages the batch crosses the stage link
(delay, jitter, bandwidth). The last stage samples and sends the tokens back
to the node. With `max_concurrent_batches` batches in flight, stages work on
different batches at once.

    BatchFrame:   seq, share_s, samples     samples[i] = (request_id, position
                  to sample) for plan entry i, position -1 = samples nothing
                  (a partial prefill chunk)
    ResultFrame:  seq, tokens               tokens[i] = [] or [token_id]
    hello frame:  the first frame on a connection into a stage: which of
                  "batches" / "results" it carries (after the run secret's
                  challenge and answer, `auth.py`, when there is a secret)
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any, NamedTuple

from connector.grpc.security import KVSecurity
from connector.link import Link, LinkSpec
from connector.stage_pipeline import STAGE_MESSAGE_BYTES
from engine.model_runner import StepPlan
from engine.sampler import DeterministicSampler

from .auth import AuthError, answer, challenge
from .clock import RunClock
from .delay_line import DelayedMailbox
from .frames import FrameConnection, FrameError, serve

logger = logging.getLogger(__name__)


class BatchFrame(NamedTuple):
    seq: int
    share_s: float
    samples: list[tuple[str, int]]

    def to_wire(self) -> list:
        return [self.seq, self.share_s, [list(s) for s in self.samples]]

    @classmethod
    def from_wire(cls, wire: Any) -> BatchFrame:
        try:
            seq, share_s, samples = wire
            return cls(int(seq), float(share_s), [(str(r), int(p)) for r, p in samples])
        except (TypeError, ValueError) as err:
            raise FrameError(f"malformed batch frame: {err}") from None


class ResultFrame(NamedTuple):
    seq: int
    tokens: list[list[int]]

    def to_wire(self) -> list:
        return [self.seq, self.tokens]

    @classmethod
    def from_wire(cls, wire: Any) -> ResultFrame:
        try:
            seq, tokens = wire
            return cls(int(seq), [list(t) for t in tokens])
        except (TypeError, ValueError) as err:
            raise FrameError(f"malformed result frame: {err}") from None


class StageWorker:
    def __init__(
        self,
        index: int,
        pp_size: int,
        sampler_seed: int,
        stop_probability: float = 0.0,
        link_to_next: LinkSpec | None = None,
        link_seed: int = 0,
        host: str = "127.0.0.1",
        secret: bytes | None = None,
        tls: KVSecurity | None = None,
    ) -> None:
        if not 0 <= index < pp_size:
            raise ValueError(f"stage index {index} is invalid for pp_size={pp_size}; allowed: 0..{pp_size - 1}")
        self.index = index
        self.pp = pp_size
        self.is_last = index == pp_size - 1
        self.host = host
        self._secret = secret
        self._tls = tls  # the run's TLS (cluster/wall/tls.py), or plain TCP
        self.connections_refused = 0
        self.sampler = DeterministicSampler(sampler_seed, stop_probability) if self.is_last else None
        self.link = None
        if link_to_next is not None and not link_to_next.is_ideal and not self.is_last:
            self.link = Link(link_to_next, seed=link_seed)
        self.clock = RunClock.starting_now()
        self.free_at = 0.0
        self.batches = 0
        self.busy_s = 0.0
        self._server: asyncio.Server | None = None
        self._next: FrameConnection | None = None
        self._to_next: DelayedMailbox[BatchFrame] | None = None
        self._results: FrameConnection | None = None
        self._queue: deque[tuple[float, BatchFrame]] = deque()
        self._queued = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- set-up ---------------------------------------------------------------
    async def serve(self) -> tuple[str, int]:
        self._server, port = await serve(self.host, self._on_connection, tls=self._tls)
        return self.host, port

    async def connect_next(self, host: str, port: int) -> None:
        if self.is_last:
            raise ValueError(f"stage {self.index} is the last of {self.pp}: it has no next stage")
        self._next = await FrameConnection.open(host, port, tls=self._tls)
        if self._secret is not None:
            await answer(self._next, self._secret, f"stage{self.index}")
        self._next.send(["batches"])

    def begin(self, start_wall: float) -> None:
        if not self.is_last and self._next is None:
            raise RuntimeError(f"stage {self.index}: connect_next() before begin()")
        self.clock = RunClock.from_wall_start(start_wall)
        self.free_at = 0.0
        if self.link is not None:
            self._to_next = DelayedMailbox(self.clock, self.link.forward, self._forward)
        self._spawn(self._compute())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- batches in -------------------------------------------------------------
    async def _on_connection(self, conn: FrameConnection) -> None:
        try:
            if self._secret is not None:
                await challenge(conn, self._secret)
            hello = await conn.recv(max_bytes=1024)
        except (AuthError, FrameError) as err:
            self.connections_refused += 1
            logger.warning("stage %d: refused a connection: %s", self.index, err)
            return
        if not isinstance(hello, list):
            return
        if "results" in hello:
            self._results = conn
        try:
            while (frame := await conn.recv()) is not None:
                if "batches" in hello:
                    self._accept(frame)
        except FrameError as err:
            logger.warning("stage %d: %s", self.index, err)

    def _accept(self, wire: list) -> None:
        try:
            frame = BatchFrame.from_wire(wire)
        except FrameError as err:
            logger.warning("stage %d: %s", self.index, err)
            return
        start = max(self.clock.now(), self.free_at)
        self.free_at = start + frame.share_s
        self.batches += 1
        self.busy_s += frame.share_s
        self._queue.append((self.free_at, frame))
        self._queued.set()

    # -- the stage's work, one batch after the other ------------------------------
    async def _compute(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._queued.clear()
                await self._queued.wait()
                continue
            done_at, frame = queue[0]
            await self.clock.sleep_until(done_at)
            queue.popleft()
            if not self.is_last:
                if self._to_next is not None:
                    self._to_next.put(frame, STAGE_MESSAGE_BYTES)
                else:
                    self._next_stage().send(frame.to_wire())
            else:
                assert self.sampler is not None  # the last stage has one: it samples
                token_at = self.sampler.token_at
                tokens = [[token_at(req_id, pos)] if pos >= 0 else [] for req_id, pos in frame.samples]
                result = ResultFrame(frame.seq, tokens)
                if self._results is None or not self._results.send(result.to_wire()):
                    logger.warning("stage %d: no node to return batch %d to", self.index, frame.seq)

    def _forward(self, frames: list[BatchFrame]) -> None:
        next_stage = self._next_stage()
        for frame in frames:
            next_stage.send(frame.to_wire())

    def _next_stage(self) -> FrameConnection:
        if self._next is None:  # `begin` refuses to start a stage before this
            raise RuntimeError(f"stage {self.index}: connect_next() before begin()")
        return self._next

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._to_next is not None:
            self._to_next.close()
        if self._next is not None:
            await self._next.close()
        if self._server is not None:
            self._server.close()


class StageStreamExecutor:
    """The decode node's executor: sends each batch to the first stage and
    awaits the last stage's tokens. A step with no tokens scheduled (it only
    carries KV completions) does not travel: it completes when the step
    before it does, as it would behind that step in the pipeline."""

    def __init__(
        self,
        first: tuple[str, int] | None = None,
        last: tuple[str, int] | None = None,
        pp_size: int = 1,
        secret: bytes | None = None,
        tls: KVSecurity | None = None,
    ) -> None:
        """The stages' addresses may be given later (`set_addresses`), before `connect`."""
        self._secret = secret
        self._tls = tls
        self.first_address = first
        self.last_address = last
        self.pp = pp_size
        self._to_first: FrameConnection | None = None
        self._from_last: FrameConnection | None = None
        self._pending: dict[int, asyncio.Future[list[list[int]]]] = {}  # seq -> the last stage's tokens
        self._last: asyncio.Future[list[list[int]]] | None = None
        self._seq = 0
        self._reader: asyncio.Task[None] | None = None
        self._broken: str | None = None

    def set_addresses(self, first: tuple[str, int], last: tuple[str, int]) -> None:
        self.first_address, self.last_address = first, last

    async def connect(self) -> None:
        if self.first_address is None or self.last_address is None:
            raise RuntimeError("StageStreamExecutor: the stages' addresses are not known yet (set_addresses)")
        self._to_first = await self._open(self.first_address)
        if self.pp == 1:
            self._to_first.send(["batches", "results"])
            self._from_last = self._to_first
        else:
            self._to_first.send(["batches"])
            self._from_last = await self._open(self.last_address)
            self._from_last.send(["results"])
        self._reader = asyncio.ensure_future(self._read_results(self._from_last))

    async def _open(self, address: tuple[str, int]) -> FrameConnection:
        conn = await FrameConnection.open(*address, tls=self._tls)
        if self._secret is not None:
            await answer(conn, self._secret, "node")
        return conn

    async def _read_results(self, from_last: FrameConnection) -> None:
        while (wire := await from_last.recv()) is not None:
            frame = ResultFrame.from_wire(wire)
            future = self._pending.pop(frame.seq, None)
            if future is not None and not future.done():
                future.set_result(frame.tokens)
        self._broken = "the last pipeline stage closed its connection"
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError(self._broken))
        self._pending.clear()

    async def execute(self, plan: StepPlan, wall_duration: float) -> list[list[int]] | None:
        if not plan.entries:
            previous = self._last
            if previous is not None and not previous.done():
                await asyncio.wait([previous])
            return None
        if self._broken:
            raise ConnectionError(self._broken)
        if self._to_first is None:
            raise ConnectionError("StageStreamExecutor: connect() before the first step")
        seq, self._seq = self._seq, self._seq + 1
        samples = [(req_id, start + n if sample else -1) for req_id, _, start, n, sample in plan.entries]
        future = asyncio.get_running_loop().create_future()
        self._pending[seq] = future
        self._last = future
        self._to_first.send(BatchFrame(seq, wall_duration / self.pp, samples).to_wire())
        return await future

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        for conn in {id(c): c for c in (self._to_first, self._from_last) if c is not None}.values():
            await conn.close()
