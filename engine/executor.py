"""The executor port: where a node sends a scheduled step to be run.

An executor takes a `StepPlan` (the scheduler's output plus what the worker
derived from it), runs it — through `pp_size` pipeline stages, taking the
modelled step time — and reports completion with the finished plan. The node
then builds the `ModelRunnerOutput` (shadow KV writes, sampling) at that
moment, and processes outputs strictly in FIFO order.

Implementations: `cluster.inproc_executor.VirtualPipelineExecutor` (virtual
clock) and the Ray stage-actor executor of the distributed runtime.
"""

from __future__ import annotations

from typing import Callable, Protocol

from .model_runner import StepPlan


class Executor(Protocol):
    def execute(self, plan: StepPlan, duration: float, on_done: Callable[[StepPlan], None]) -> None:
        """Run `plan` for `duration` modelled seconds in total across stages;
        call `on_done(plan)` when the last stage has finished."""
        ...
