"""The engine loop's bookkeeping, shaped like vLLM's `EngineCore` with a batch
queue (`step_with_batch_queue`, `vllm/v1/engine/core.py`), independent of how
time passes. A runtime (virtual clock in-process, wall clock under Ray) drives
it:

    while (plan := core.schedule_step(now)) is not None:
        submit plan to the executor
    when the oldest submitted step completes:
        outputs = core.process_oldest(model_runner_output)

Depth 1 is the plain schedule -> execute -> update loop. With depth > 1, step
N+1 is scheduled before step N's output is processed — which arms the fence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from .model_runner import SimModelRunner, StepPlan
from .outputs import EngineCoreOutput, EngineCoreOutputs, ModelRunnerOutput, SchedulerOutput, SteadyTokens
from .records import StepRecord
from .request import Request, RequestStatus


class EngineScheduler(Protocol):
    """What the engine loop needs from a scheduler. The v1 `Scheduler` and the
    legacy v0 scheduler's adapter (`engine.v0.V0SchedulerAdapter`) both provide it."""

    def add_request(self, request: Request) -> None: ...
    def finish_requests(self, request_ids: list[str], finished_status: RequestStatus) -> object: ...
    def has_requests(self) -> bool: ...
    def schedule(self) -> SchedulerOutput: ...
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]: ...

    # The time a step is scheduled at. v1 reads no clock; v0 orders `running`
    # by `now - arrival_time` and logs its periodic stats line on this clock.
    def advance_clock(self, now: float) -> None: ...

    # An empty step is dropped unless its update produces something (v0: the
    # outputs of prompts it ignored, or its preemptions to act on).
    def step_needs_update(self, scheduler_output: SchedulerOutput) -> bool: ...

    # The step records' numbers.
    def get_request_counts(self) -> tuple[int, int]: ...
    def num_waiting_for_remote_kvs(self) -> int: ...
    def get_num_free_gpu_blocks(self) -> int: ...
    def get_num_total_gpu_blocks(self) -> int: ...
    def num_deferred_free_blocks(self) -> int: ...
    def get_preemption_totals(self) -> tuple[int, int]: ...


class EngineCore:
    def __init__(
        self,
        name: str,
        scheduler: EngineScheduler,
        runner: SimModelRunner,
        max_concurrent_batches: int,
        worker_has_output: Callable[[], bool] = lambda: False,
        record_steps: bool = True,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> None:
        if max_concurrent_batches < 1:
            raise ValueError(f"max_concurrent_batches={max_concurrent_batches} is invalid; allowed: >= 1")
        self.name = name
        self.scheduler = scheduler
        self.runner = runner
        self.depth = max_concurrent_batches
        self.batch_queue: deque[StepPlan] = deque()
        # Finished requests to retire in the runner once the step named is processed.
        self._to_retire: deque[tuple[StepPlan, list[str]]] = deque()
        self.worker_has_output = worker_has_output
        self.pending_aborts: list[str] = []
        self.record_steps = record_steps
        self.step_records: list[StepRecord] = []
        self.first_scheduled: dict[str, float] = {}
        self.num_steps = 0
        # Live observation (metrics exporters, log lines): every step record.
        self.on_step = on_step

    # ---------------------------------------------------------------- inputs
    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Applied just before the next output is processed (as vLLM does),
        or at once when nothing is in flight."""
        if self.batch_queue:
            self.pending_aborts.extend(request_ids)
        else:
            self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    # ------------------------------------------------------------------ loop
    @property
    def queue_full(self) -> bool:
        return len(self.batch_queue) >= self.depth

    def has_work(self) -> bool:
        return self.scheduler.has_requests() or bool(self.batch_queue)

    def schedule_step(self, now: float) -> StepPlan | None:
        """Schedule and queue one step if the queue has room and there is work.

        An empty step is queued like any other while a non-empty one is in
        flight (it occupies a queue slot, as in vLLM). When nothing is in
        flight and the empty step carries nothing for the worker, nor for the
        scheduler's own update (`step_needs_update`: v0's ignored prompts and
        self-preemptions), it is dropped and the engine goes idle until an
        external event: executing it would change no state, and on a virtual
        clock it would spin.
        """
        if self.queue_full or not self.scheduler.has_requests():
            return None
        self.scheduler.advance_clock(now)
        return self.queue_step(now, self.scheduler.schedule())

    def ids_in_flight(self) -> set[str]:
        """Requests a step in flight names (scheduled in it, or finished by
        it and not yet retired)."""
        ids: set[str] = set()
        for plan in self.batch_queue:
            ids.update(plan.scheduler_output.num_scheduled_tokens)
            ids.update(plan.scheduler_output.finished_req_ids)
        for _, finished in self._to_retire:
            ids.update(finished)
        return ids

    def queue_step(self, now: float, so: SchedulerOutput) -> StepPlan | None:
        """The rest of `schedule_step` for a scheduled step (also one the
        steady-decode fast path scheduled, engine/steady_decode.py)."""
        plan = self.runner.begin_step(so)
        if so.finished_req_ids and self.runner.retires:
            # The requests this step's output names as finished are in no
            # step scheduled from now on; the ones in flight may still read them.
            if self.batch_queue:
                self._to_retire.append((self.batch_queue[-1], list(so.finished_req_ids)))
            else:
                for req_id in so.finished_req_ids:
                    self.runner.retire(req_id)
        if (
            so.total_num_scheduled_tokens == 0
            and not self._carries_work(plan)
            and not any(p.scheduler_output.total_num_scheduled_tokens for p in self.batch_queue)
            and not self.scheduler.step_needs_update(so)
        ):
            return None
        self.batch_queue.append(plan)
        self.num_steps += 1
        for new in so.scheduled_new_reqs:
            self.first_scheduled.setdefault(new.req_id, now)
        if self.record_steps:
            self._record(now, plan)
        return plan

    def _carries_work(self, plan: StepPlan) -> bool:
        meta = plan.scheduler_output.kv_connector_metadata
        return bool(self.worker_has_output() or (meta is not None and getattr(meta, "reqs_to_recv", None)))

    def oldest(self) -> StepPlan | None:
        return self.batch_queue[0] if self.batch_queue else None

    def process_oldest(self, model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput | SteadyTokens]:
        plan = self.batch_queue.popleft()
        while self._to_retire and self._to_retire[0][0] is plan:
            for req_id in self._to_retire.popleft()[1]:
                self.runner.retire(req_id)
        if self.pending_aborts:
            aborts, self.pending_aborts = self.pending_aborts, []
            self.scheduler.finish_requests(aborts, RequestStatus.FINISHED_ABORTED)
        result = self.scheduler.update_from_output(plan.scheduler_output, model_runner_output)
        return result[0].outputs if result else []

    # --------------------------------------------------------------- records
    def _record(self, now: float, plan: StepPlan) -> None:
        s = self.scheduler
        so = plan.scheduler_output
        num_running, num_waiting = s.get_request_counts()
        num_preemptions, num_zero_progress = s.get_preemption_totals()
        # Positional (the field order of `StepRecord`): keyword matching of
        # sixteen arguments costs more than the rest of the record, per step.
        record = StepRecord(
            self.name,
            now,
            so.step_index,
            plan.shape.batch_size,
            so.total_num_scheduled_tokens,
            plan.shape.prefill_tokens,
            plan.shape.decode_tokens,
            num_running,
            num_waiting,
            s.num_waiting_for_remote_kvs(),
            s.get_num_free_gpu_blocks(),
            s.num_deferred_free_blocks(),
            s.get_num_total_gpu_blocks(),
            len(self.batch_queue),
            num_preemptions,
            num_zero_progress,
        )
        self.step_records.append(record)
        if self.on_step is not None:
            self.on_step(record)
