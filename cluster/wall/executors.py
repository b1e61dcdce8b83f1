"""The wall-clock `StepExecutor`s: a step takes its scaled duration in real
time. `WallExecutor` adapts an asyncio runner to the node's port (one task
per step; its outcome comes back as `on_done` / `on_error`). Two runners:

- `LocalPipeline`: the `pp_size` stages modelled inside the node's process
  (`connector.stage_pipeline.StagePipeline` on the run clock) — the prefill
  side, which has no stage workers;
- `stage_worker.StageStreamExecutor`: the decode node's pipeline stages as
  separate processes (Ray actors), the batch travelling stage to stage.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Protocol

from connector.link import Link
from connector.stage_pipeline import StagePipeline
from engine.model_runner import StepPlan
from node.ports import StepDone

from .clock import WallClock


class StepRunner(Protocol):
    async def connect(self) -> None:
        """Reach the workers (if any) before the first step."""
        ...

    async def execute(self, plan: StepPlan, wall_duration: float) -> list[list[int]] | None:
        """Run one step; the sampled tokens per plan entry, or None to let the
        node's runner sample (the sampler is deterministic)."""
        ...

    async def close(self) -> None: ...


class LocalPipeline:
    def __init__(self, pp_size: int, clock: WallClock, stage_link: Link | None = None) -> None:
        self.clock = clock
        self.pipeline = StagePipeline(pp_size, stage_link)

    async def connect(self) -> None:
        pass

    async def execute(self, plan: StepPlan, wall_duration: float) -> None:
        run_clock = self.clock.run_clock
        done_at = self.pipeline.finish_time(run_clock.now(), wall_duration)
        if math.isinf(done_at):
            raise ConnectionError("a stage link broke")
        await run_clock.sleep_until(done_at)
        return None

    async def close(self) -> None:
        pass


class WallExecutor:
    def __init__(self, runner: StepRunner) -> None:
        self.runner = runner
        self._tasks: set[asyncio.Task] = set()

    def execute(self, plan: StepPlan, duration_s: float, on_done: StepDone, on_error: Callable[[str], None]) -> None:
        task = asyncio.ensure_future(self._run(plan, duration_s, on_done, on_error))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, plan: StepPlan, duration_s: float, on_done: StepDone, on_error: Callable[[str], None]) -> None:
        try:
            tokens = await self.runner.execute(plan, duration_s)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a stage worker died or failed: the node cannot go on
            on_error(f"{type(err).__name__}: {err}")
            return
        on_done(plan, tokens)

    async def connect(self) -> None:
        await self.runner.connect()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runner.close()
