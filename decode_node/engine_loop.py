"""A node's engine loop on the wall clock: the same `NodeCore` bookkeeping
as the virtual-clock `cluster/inproc_node.py`, driven by asyncio.

    schedule_step -> submit to the executor (which sleeps the step's scaled
    duration, through its pipeline stages) -> when a step completes, the
    worker side finishes it (shadow KV writes happen here, where the batch
    completes) -> process the oldest completed steps in FIFO order -> kick.

Up to `max_concurrent_batches` steps are in flight, so step N+1 is scheduled
before step N's output is processed, exactly as in vLLM's
`step_with_batch_queue`. Shared by the prefill and the decode node.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable, Protocol

from connector.link import Link
from connector.stage_pipeline import StagePipeline
from engine.model_runner import StepPlan
from engine.node_core import NodeCore
from engine.outputs import EngineCoreOutput
from engine.request import Request

from .settings import WallNodeSettings
from .wall_clock import RunClock

logger = logging.getLogger(__name__)



class StepExecutor(Protocol):
    async def connect(self) -> None:
        """Reach the workers (if any) before the first step."""
        ...

    async def execute(self, plan: StepPlan, wall_duration: float) -> list[list[int]] | None:
        """Run one step; return the sampled tokens per plan entry, or None to
        let the node's runner sample (the sampler is deterministic)."""
        ...

    async def close(self) -> None: ...


class LocalPipelineExecutor:
    """`pp_size` stages modelled inside the node's process: stage i is busy
    for its share of each step, batches queue per stage in FIFO order, and
    the stage link (if any) delays the hand-over between stages."""

    def __init__(self, pp_size: int, clock: RunClock, stage_link: Link | None = None) -> None:
        self.pp = pp_size
        self.clock = clock
        self.pipeline = StagePipeline(pp_size, stage_link)

    async def execute(self, plan: StepPlan, wall_duration: float) -> None:
        await self.clock.sleep_until(self.pipeline.finish_time(self.clock.now(), wall_duration))
        return None

    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        pass


@dataclass
class StepTiming:
    """Wall timing of one submitted step (run seconds) against its model."""

    step_index: int
    submitted: float
    modelled_s: float  # unscaled cost-model duration
    wall_s: float  # what the executor was asked to take (scaled)
    completed: float | None = None


class EngineLoop:
    def __init__(
        self,
        core: NodeCore,
        executor: StepExecutor,
        settings: WallNodeSettings,
        clock: RunClock,
        emit: Callable[[list[EngineCoreOutput]], None],
        on_submit: Callable[[StepPlan], None] | None = None,
    ) -> None:
        self.core = core
        self.executor = executor
        self.settings = settings
        self.cost_model = settings.cost_model
        self.clock = clock
        self.emit = emit
        self.on_submit = on_submit
        self.alive = True
        self.error: str | None = None
        self.timings: list[StepTiming] = []
        self.stage_token_mismatches = 0
        self._done: dict[int, object] = {}
        self._tasks: set[asyncio.Task] = set()
        self._kick_pending = False

    # -- inputs ---------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if not self.alive:
            raise RuntimeError(f"{self.core.name}: the engine loop has stopped ({self.error or 'closed'})")
        self.core.engine.add_request(request)
        self.wake()

    def abort(self, request_ids: list[str]) -> None:
        self.core.engine.abort_requests(request_ids)
        self.wake()

    def wake(self) -> None:
        """Run the scheduling pass soon (coalesced: many wakes, one pass)."""
        if self.alive and not self._kick_pending:
            self._kick_pending = True
            asyncio.get_running_loop().call_soon(self._kick)

    # -- the loop ---------------------------------------------------------------
    def _kick(self) -> None:
        self._kick_pending = False
        if not self.alive:
            return
        engine = self.core.engine
        while (plan := engine.schedule_step(self.clock.now())) is not None:
            self._submit(plan)

    def _submit(self, plan: StepPlan) -> None:
        if self.on_submit is not None:
            self.on_submit(plan)
        modelled = self.cost_model.step_time(plan.shape)
        engine = self.core.engine
        if engine.record_steps and engine.step_records:
            engine.step_records[-1].duration = modelled
        timing = StepTiming(plan.scheduler_output.step_index, self.clock.now(), modelled,
                            self.settings.wall_seconds(modelled))
        self.timings.append(timing)
        task = asyncio.ensure_future(self._run_step(plan, timing))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_step(self, plan: StepPlan, timing: StepTiming) -> None:
        try:
            tokens = await self.executor.execute(plan, timing.wall_s)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a stage worker died or failed: the node cannot go on
            self._fail(f"step {timing.step_index} failed in the executor: {type(err).__name__}: {err}")
            return
        if self.alive:
            timing.completed = self.clock.now()
            self._complete(plan, tokens)

    def _complete(self, plan: StepPlan, tokens: list[list[int]] | None) -> None:
        """A step came back. Steps finish in submission order, as batches
        leave a pipeline: one that came back early (replies can overtake
        each other between processes) waits for its predecessors, so its
        shadow KV reads see what they wrote."""
        self._done[id(plan)] = tokens
        core = self.core
        engine = core.engine
        outputs: list[EngineCoreOutput] = []
        while (oldest := engine.oldest()) is not None and id(oldest) in self._done:
            outputs.extend(engine.process_oldest(self._finish_step(oldest, self._done.pop(id(oldest)))))
        if outputs:
            self.emit(outputs)
        self._kick()

    def _finish_step(self, plan: StepPlan, tokens: list[list[int]] | None):
        """The worker side's end of a step: shadow KV reads and writes (the
        in-flight write lands here), sampled tokens, KV completions."""
        core = self.core
        mro = core.runner.finish_step(plan, self.clock.now(), core.take_connector_output())
        if tokens is not None:
            # The last stage sampled; the runner's own sample must agree (same
            # deterministic sampler), else the stage was configured wrongly.
            if tokens != mro.sampled_token_ids:
                self.stage_token_mismatches += 1
            mro.sampled_token_ids = tokens
        return mro

    def _fail(self, reason: str) -> None:
        logger.error("%s: %s", self.core.name, reason)
        self.error = reason
        self.alive = False

    # -- state ------------------------------------------------------------------
    def is_idle(self) -> bool:
        """Nothing to schedule and nothing in flight (or the loop has stopped)."""
        return not self.core.engine.has_work() or not self.alive

    async def close(self) -> None:
        self.alive = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.executor.close()
