"""The virtual-clock `StepExecutor`: `pp_size` pipeline stages as
arithmetic (`connector.stage_pipeline.StagePipeline`). A step occupies each
stage for its share of the modelled step time, in order; a stage works on
one batch at a time, so different batches overlap in different stages.
Stage-to-stage hops go through the stage link."""

from __future__ import annotations

import math
from collections.abc import Callable

from connector.link import Link
from connector.stage_pipeline import StagePipeline
from engine.model_runner import StepPlan
from node.ports import StepDone

from .clock import EventLoop


class VirtualPipelineExecutor:
    def __init__(self, loop: EventLoop, pp_size: int, stage_link: Link | None = None) -> None:
        self.loop = loop
        self.pipeline = StagePipeline(pp_size, stage_link)
        self.busy_time = 0.0
        # The in-process cluster marks a prefill node's executor (fast_forward.py).
        self.serves_prefill = False
        # Chaos mode: (start, end, factor) windows in which steps take longer.
        self.slow_windows: list[tuple[float, float, float]] = []

    def execute(self, plan: StepPlan, duration_s: float, on_done: StepDone, on_error: Callable[[str], None]) -> None:
        now = self.loop.now()
        for start, end, factor in self.slow_windows:
            if start <= now < end:
                duration_s *= factor
        self.busy_time += duration_s
        done_at = self.pipeline.finish_time(self.loop.now(), duration_s)
        if math.isinf(done_at):
            self.loop.call_soon(on_error, "a stage link broke")
            return
        self.loop.at(done_at, self._done, on_done, plan)

    def _done(self, on_done: StepDone, plan: StepPlan) -> None:
        """A step came back (one named function, so the fast-forward can tell
        a prefill node's step completion in the loop's queue)."""
        on_done(plan, None)
