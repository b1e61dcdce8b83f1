"""A scheduled step's `SchedulerOutput`: built from what `schedule()`'s
passes chose, then sealed (the connector's metadata, the fence's step
number, and `Scheduler._update_after_schedule`). Shared by the full pass and
its idle shortcut (scheduler.py) and the steady step (steady_step.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .kv_cache_manager import KVCacheBlocks
from .outputs import CachedRequestData, NewRequestData, SchedulerOutput
from .request import Request

if TYPE_CHECKING:
    from .scheduler import Scheduler


class StepOutputMixin:
    # `self: "Scheduler"` and its `type: ignore[misc]`: see `OutputProcessorMixin`.
    def _step_begins(self: Scheduler) -> None:  # type: ignore[misc]
        """A new step number; the steady cohort is stale from now on."""
        self.settle_steady()
        self.current_step += 1
        self.steady_epoch += 1
        self.kv_cache_manager.new_step_starts()

    def _seal(self: Scheduler, so: SchedulerOutput) -> None:  # type: ignore[misc]
        """The step is scheduled: the connector's metadata, the fence's step
        number (a step with tokens takes the next), the requests' counters."""
        if self.connector is not None:
            so.kv_connector_metadata = self.connector.build_connector_meta(so)
        if self.defer_block_free and so.total_num_scheduled_tokens > 0:
            self.sched_step_seq += 1
        so.sched_step_seq = self.sched_step_seq
        self._update_after_schedule(so)

    def _output_after_bulk_running(  # type: ignore[misc]
        self: Scheduler, b: int, long_prefill_threshold: int
    ) -> SchedulerOutput:
        """The rest of a step whose running pass gave `b` requests one token
        each in bulk (steady_step.py, bulk_step.py): the scheduler's own
        waiting pass with what they left of the budgets, and the step's
        output, whose per-request fields hold only what that pass admitted;
        `total_num_scheduled_tokens` counts the `b` tokens too."""
        scheduled_new_reqs: list[Request] = []
        scheduled_resumed_reqs: list[Request] = []
        req_to_new_blocks: dict[str, KVCacheBlocks] = {}
        num_scheduled_tokens: dict[str, int] = {}
        self._schedule_waiting(
            self.max_num_scheduled_tokens - b,
            self.scheduler_config.max_num_batched_tokens - b,
            False,
            long_prefill_threshold,
            scheduled_new_reqs,
            scheduled_resumed_reqs,
            req_to_new_blocks,
            num_scheduled_tokens,
        )
        total = b + sum(num_scheduled_tokens.values())
        assert total <= self.max_num_scheduled_tokens
        assert len(self.running) <= self.max_num_running_reqs
        return self._make_scheduler_output(
            scheduled_new_reqs, [], scheduled_resumed_reqs, req_to_new_blocks, num_scheduled_tokens, total
        )

    def _make_scheduler_output(  # type: ignore[misc]
        self: Scheduler,
        scheduled_new_reqs: list[Request],
        scheduled_running_reqs: list[Request],
        scheduled_resumed_reqs: list[Request],
        req_to_new_blocks: dict[str, KVCacheBlocks],
        num_scheduled_tokens: dict[str, int],
        total_num_scheduled_tokens: int,
    ) -> SchedulerOutput:
        """The step's `SchedulerOutput` (also for the steady step, engine/steady_step.py)."""
        return SchedulerOutput(
            scheduled_new_reqs=self._make_new_request_data(scheduled_new_reqs, req_to_new_blocks),
            scheduled_cached_reqs=self._make_cached_request_data(
                scheduled_running_reqs, scheduled_resumed_reqs, req_to_new_blocks
            ),
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=total_num_scheduled_tokens,
            scheduled_spec_decode_tokens={},
            num_common_prefix_blocks=[0],
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids=self.reset_preempted_req_ids,
            step_index=self.current_step,
        )

    @staticmethod
    def _make_new_request_data(reqs: list[Request], req_to_new_blocks: dict) -> list[NewRequestData]:
        return [
            NewRequestData(
                req.request_id,
                req.num_prompt_tokens,
                req_to_new_blocks[req.request_id].get_block_ids(),
                req.num_computed_tokens,
            )
            for req in reqs
        ]

    @staticmethod
    def _make_cached_request_data(
        running_reqs: list[Request],
        resumed_reqs: list[Request],
        req_to_new_blocks: dict[str, KVCacheBlocks],
    ) -> CachedRequestData:
        data = CachedRequestData()
        for req in running_reqs:
            data.req_ids.append(req.request_id)
            blocks = req_to_new_blocks[req.request_id].blocks
            data.new_block_ids.append([b.block_id for b in blocks] if blocks else None)
            data.num_computed_tokens.append(req.num_computed_tokens)
        for req in resumed_reqs:
            data.req_ids.append(req.request_id)
            data.resumed_req_ids.add(req.request_id)
            data.new_block_ids.append(req_to_new_blocks[req.request_id].get_block_ids())
            data.num_computed_tokens.append(req.num_computed_tokens)
        return data
