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
from typing import Callable

from .model_runner import SimModelRunner, StepPlan
from .outputs import EngineCoreOutput, ModelRunnerOutput
from .records import StepRecord
from .request import Request, RequestStatus
from .scheduler import Scheduler


class EngineCore:
    def __init__(
        self,
        name: str,
        scheduler: Scheduler,
        runner: SimModelRunner,
        max_concurrent_batches: int,
        worker_has_output: Callable[[], bool] = lambda: False,
        record_steps: bool = True,
    ) -> None:
        if max_concurrent_batches < 1:
            raise ValueError(f"max_concurrent_batches={max_concurrent_batches} is invalid; allowed: >= 1")
        self.name = name
        self.scheduler = scheduler
        self.runner = runner
        self.depth = max_concurrent_batches
        self.batch_queue: deque[StepPlan] = deque()
        self.worker_has_output = worker_has_output
        self.pending_aborts: list[str] = []
        self.record_steps = record_steps
        self.step_records: list[StepRecord] = []
        self.first_scheduled: dict[str, float] = {}
        self.num_steps = 0
        # Live observation (metrics exporters, log lines) hooks in here.
        self.on_step: Callable[[StepRecord], None] | None = None

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
        flight and the empty step carries nothing for the worker, it is
        dropped and the engine goes idle until an external event: executing
        it would change no state, and on a virtual clock it would spin.
        """
        if self.queue_full or not self.scheduler.has_requests():
            return None
        so = self.scheduler.schedule()
        plan = self.runner.begin_step(so)
        if so.total_num_scheduled_tokens == 0 and not self._carries_work(plan) and not any(
            p.scheduler_output.total_num_scheduled_tokens for p in self.batch_queue
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

    def process_oldest(self, model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        plan = self.batch_queue.popleft()
        if self.pending_aborts:
            aborts, self.pending_aborts = self.pending_aborts, []
            self.scheduler.finish_requests(aborts, RequestStatus.FINISHED_ABORTED)
        result = self.scheduler.update_from_output(plan.scheduler_output, model_runner_output)
        return result[0].outputs if result else []

    # --------------------------------------------------------------- records
    def _record(self, now: float, plan: StepPlan) -> None:
        s = self.scheduler
        so = plan.scheduler_output
        c = s.counters
        record = StepRecord(
                node=self.name,
                time=now,
                step_index=so.step_index,
                batch_size=plan.shape.batch_size,
                num_scheduled_tokens=so.total_num_scheduled_tokens,
                num_prefill_tokens=plan.shape.prefill_tokens,
                num_decode_tokens=plan.shape.decode_tokens,
                num_running=len(s.running),
                num_waiting=len(s.waiting) + len(s.kv_holding_waiting),
                num_waiting_for_remote_kvs=s.num_waiting_for_remote_kvs() if s.connector is not None else 0,
                num_free_blocks=s.kv_cache_manager.block_pool.get_num_free_blocks(),
                num_deferred_blocks=c.deferred_free_blocks,
                num_total_blocks=s.kv_cache_manager.block_pool.num_gpu_blocks - 1,
                batches_in_flight=len(self.batch_queue),
                num_preemptions_total=c.num_preemptions,
                num_zero_progress_preemptions_total=c.num_zero_progress_preemptions,
            )
        self.step_records.append(record)
        if self.on_step is not None:
            self.on_step(record)
