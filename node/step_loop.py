"""A node's engine loop over its `NodeCore`, written once for both runtimes:

    schedule_step -> the executor runs it (through the pipeline stages, for
    the step's modelled time) -> when it comes back, the worker side
    finishes it (the shadow KV writes land here) -> process the oldest
    completed steps in FIFO order -> schedule again.

Up to `max_concurrent_batches` steps are in flight, so step N+1 is scheduled
before step N's output is processed, exactly as in vLLM's
`step_with_batch_queue` — which arms the fence. Every step's modelled
duration goes into its step record, and its run timing into `timings`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from engine.model_runner import StepPlan
from engine.node_core import NodeCore
from engine.outputs import EngineCoreOutput, SteadyTokens
from engine.request import Request

from .ports import Clock, StepExecutor
from .settings import NodeSettings

logger = logging.getLogger(__name__)


@dataclass
class StepTiming:
    """When one step was submitted and came back (run seconds), against its model."""

    step_index: int
    submitted: float
    modelled_s: float  # unscaled cost-model duration
    run_s: float  # what the executor was asked to take (scaled)
    completed: float | None = None


class StepLoop:
    def __init__(
        self,
        core: NodeCore,
        executor: StepExecutor,
        clock: Clock,
        settings: NodeSettings,
        on_outputs: Callable[[list[EngineCoreOutput | SteadyTokens]], None],
        on_submit: Callable[[StepPlan], None] | None = None,
        check_each_step: bool = False,
    ) -> None:
        self.core = core
        self.executor = executor
        self.clock = clock
        self.settings = settings
        self.on_outputs = on_outputs
        self.on_submit = on_submit
        self.check_each_step = check_each_step
        self.alive = True
        self.error: str | None = None
        # Told when the loop stops on a failure (a step the executor could not
        # complete): the runtime then takes the node out of the run, so the
        # proxy re-routes or fails every request it had (issue 34: requests
        # were left neither finished nor failed when a stage link broke).
        self.on_failure: Callable[[str], None] | None = None
        self.timings: list[StepTiming] = []
        # Wall-clock runtimes read these (the distortion report); on a
        # virtual clock a step takes exactly its run time, so a runtime may
        # turn keeping them off.
        self.keep_timings = True
        self.stage_token_mismatches = 0
        self._done: dict[int, list[list[int]] | None] = {}
        self._kick_pending = False
        # A runtime may take steady decode in bulk (the in-process one:
        # cluster/inproc/fast_forward.py); True = it took care of this pass
        # (submitted a step, or forwarded steps and will `_kick` after them).
        self.fast_forward: Callable[[], bool] | None = None
        # Set by that runtime while steps it took in bulk are in flight: it
        # kicks the loop when they end, so a wake meanwhile has nothing to do.
        self.forwarding = False

    # -- inputs ---------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if not self.alive:
            raise RuntimeError(f"{self.core.name}: the engine loop has stopped ({self.error or 'closed'})")
        self.core.add_request(request)
        self.wake()

    def abort(self, request_ids: list[str]) -> None:
        self.core.abort_requests(request_ids)
        self.wake()

    def wake(self) -> None:
        """Run the scheduling pass after the current event (coalesced: many wakes, one pass)."""
        if self.alive and not self._kick_pending and not self.forwarding:
            self._kick_pending = True
            self.clock.call_soon(self._kick)

    def stop(self, reason: str | None = None) -> None:
        """No more steps; a step that comes back later is ignored."""
        failed = reason is not None and self.error is None and self.alive
        if reason is not None and self.error is None:
            logger.error("%s: %s", self.core.name, reason)
            self.error = reason
        self.alive = False
        if failed and self.on_failure is not None:
            self.on_failure(reason)  # type: ignore[arg-type]

    # -- the loop ---------------------------------------------------------------
    def submit(self, plan: StepPlan) -> None:
        """Send a step scheduled outside the loop's own pass (the steady-decode
        fast-forward's admission step) to the executor, as the loop does."""
        self._submit(plan)

    def resume(self) -> None:
        """A fast-forward's last step is back: the loop schedules on."""
        self.forwarding = False
        if self.alive:
            self._kick()

    def _kick(self) -> None:
        self._kick_pending = False
        if not self.alive:
            return
        if self.fast_forward is not None and self.fast_forward():
            return
        while (plan := self.core.schedule_step(self.clock.now())) is not None:
            self._submit(plan)

    def _submit(self, plan: StepPlan) -> None:
        if self.on_submit is not None:
            self.on_submit(plan)
        modelled = self.settings.cost_model.step_time(plan.shape)
        records = self.core.step_records
        if records and records[-1].step_index == plan.scheduler_output.step_index:
            record, shape = records[-1], plan.shape
            record.duration = modelled
            record.context_tokens = shape.context_tokens
            record.decode_context_tokens = shape.decode_context_tokens
            record.prefill_attention_pairs = shape.prefill_attention_pairs
        timing = StepTiming(
            plan.scheduler_output.step_index, self.clock.now(), modelled, self.settings.run_seconds(modelled)
        )
        if self.keep_timings:
            self.timings.append(timing)

        def done(plan: StepPlan, tokens: list[list[int]] | None) -> None:
            if self.alive:
                timing.completed = self.clock.now()
                self._complete(plan, tokens)

        def failed(reason: str) -> None:
            self.stop(f"step {timing.step_index} failed in the executor: {reason}")

        self.executor.execute(plan, timing.run_s, done, failed)

    def _complete(self, plan: StepPlan, tokens: list[list[int]] | None) -> None:
        """A step came back. Steps finish in submission order, as batches
        leave a pipeline: one that came back early (replies can overtake
        each other between processes) waits for its predecessors, so its
        shadow KV reads see what they wrote."""
        self._done[id(plan)] = tokens
        core = self.core
        outputs: list[EngineCoreOutput | SteadyTokens] = []
        while (oldest := core.oldest()) is not None and id(oldest) in self._done:
            sampled = self._done.pop(id(oldest))
            mro = core.finish_step(oldest, self.clock.now())
            if sampled is not None:
                # The last stage sampled; the runner's own sample must agree (same
                # deterministic sampler), else the stage was configured wrongly.
                if sampled != mro.sampled_token_ids:
                    self.stage_token_mismatches += 1
                mro.sampled_token_ids = sampled
            outputs.extend(core.process_oldest(mro))
            if self.check_each_step:
                core.check_block_conservation()
        if outputs:
            self.on_outputs(outputs)
        self._kick()

    # -- state ------------------------------------------------------------------
    def is_idle(self) -> bool:
        """Nothing to schedule and nothing in flight (or the loop has stopped)."""
        return not self.alive or not self.core.has_work()
