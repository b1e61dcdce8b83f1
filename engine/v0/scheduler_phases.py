"""The three phases of a v0 scheduling pass (vLLM 0.5.3.post1's
`_schedule_running`, `_schedule_swapped`, `_schedule_prefills`), each taking
from its queue into the step's budget, and what a group asks of that
budget. `Scheduler` (engine/v0/scheduler.py) runs them in the order of its
step shape; the order rules they implement are listed there."""

from __future__ import annotations

import logging
from collections import deque
from itertools import islice

from engine.v0.block_manager import AllocStatus
from engine.v0.block_ops import PreemptionMode, allocate_and_set_running, append_slots, swap_in
from engine.v0.loglines import (
    LOGGER_NAME,
    format_prompt_exceeds_capacity,
    format_prompt_too_long,
    format_swap_in_infeasible,
)
from engine.v0.policy import Policy
from engine.v0.scheduler_outputs import (
    ScheduledSequenceGroup,
    SchedulerPrefillOutputs,
    SchedulerRunningOutputs,
    SchedulerSwappedInOutputs,
    SchedulingBudget,
)
from engine.v0.scheduler_queues import SchedulerQueues
from engine.v0.sequence import SequenceGroup, SequenceStage, SequenceStatus
from engine.v0.starvation import probe_head_of_line

logger = logging.getLogger(LOGGER_NAME)


class SchedulerPhases(SchedulerQueues):
    # -- the three phases --------------------------------------------------------
    def _schedule_running(
        self,
        running_queue: deque[SequenceGroup],
        budget: SchedulingBudget,
        policy: Policy,
        enable_chunking: bool = False,
    ) -> tuple[deque[SequenceGroup], SchedulerRunningOutputs]:
        out = SchedulerRunningOutputs()
        running_queue = policy.sort_by_priority(self._now, running_queue)
        # This loop visits every running group every step: the n=1 cases of
        # `_get_num_new_tokens`, `can_append_slots` and `append_slots` are inlined.
        bm = self.block_manager
        gpu_free, tables, block_size = bm.gpu_allocator.free_blocks, bm.block_tables, bm.block_size
        decodes, prefills = out.decode_seq_groups, out.prefill_seq_groups
        running, decode = SequenceStatus.RUNNING, SequenceStage.DECODE
        # budget.add_num_batched_tokens, inlined: the budget's own request-id set and count.
        batched_ids = budget._request_ids_num_batched_tokens
        while running_queue:
            seq_group = running_queue[0]
            seq = seq_group.seqs[0]
            if seq.status is not running:  # not reachable in vLLM's flow; its assert fires
                num_running_tokens = self._get_num_new_tokens(seq_group, running, enable_chunking, budget)
            else:
                num_running_tokens = 1 if seq._stage is decode else seq._len - seq._num_computed_tokens
                if enable_chunking:  # even a decode stops the pass once the budget is spent
                    num_running_tokens = min(num_running_tokens, budget.remaining_token_budget())
            if num_running_tokens == 0:
                break
            running_queue.popleft()
            # can_append_slots: one free block per running sequence (here: one).
            while not gpu_free:
                # vLLM takes back the budget of the group being scheduled, not the victim's.
                budget.subtract_num_batched_tokens(seq_group.request_id, num_running_tokens)
                budget.subtract_num_seqs(seq_group.request_id, seq_group.get_max_num_running_seqs())
                if running_queue:
                    victim = running_queue.pop()  # rule 4: the tail, i.e. the latest arrival
                    mode = self._preempt(victim, out.blocks_to_swap_out)
                    (out.preempted if mode is PreemptionMode.RECOMPUTE else out.swapped_out).append(victim)
                else:
                    mode = self._preempt(seq_group, out.blocks_to_swap_out)
                    (out.preempted if mode is PreemptionMode.RECOMPUTE else out.swapped_out).append(seq_group)
                    break
            else:
                if len(tables[seq.seq_id]) * block_size < seq._len:  # append_slots needs a block
                    bm.append_slots(seq)
                if seq._stage is decode:
                    decodes.append(ScheduledSequenceGroup(seq_group, 1))
                else:
                    prefills.append(ScheduledSequenceGroup(seq_group, num_running_tokens))
                if seq_group.request_id not in batched_ids:
                    batched_ids.add(seq_group.request_id)
                    budget._num_batched_tokens += num_running_tokens
                # The default path pre-added the running sequences already.
                if enable_chunking:
                    budget.add_num_seqs(seq_group.request_id, 1)
        return running_queue, out

    def _schedule_swapped(
        self,
        swapped_queue: deque[SequenceGroup],
        budget: SchedulingBudget,
        policy: Policy,
        enable_chunking: bool = False,
    ) -> tuple[deque[SequenceGroup], SchedulerSwappedInOutputs]:
        out = SchedulerSwappedInOutputs()
        swapped_queue = policy.sort_by_priority(self._now, swapped_queue)
        while swapped_queue:
            seq_group = swapped_queue[0]
            alloc_status = self.block_manager.can_swap_in(seq_group)
            if alloc_status == AllocStatus.LATER:
                break
            if alloc_status == AllocStatus.NEVER:
                # vLLM leaves the group's CPU blocks allocated: nothing frees them.
                logger.warning(format_swap_in_infeasible(seq_group.request_id))
                for seq in seq_group.get_seqs():
                    seq.status = SequenceStatus.FINISHED_IGNORED
                out.infeasible_seq_groups.append(seq_group)
                swapped_queue.popleft()
                continue
            num_new_seqs = seq_group.get_max_num_running_seqs()
            num_new_tokens = self._get_num_new_tokens(seq_group, SequenceStatus.SWAPPED, enable_chunking, budget)
            if num_new_tokens == 0 or not budget.can_schedule(num_new_tokens=num_new_tokens, num_new_seqs=num_new_seqs):
                break
            swapped_queue.popleft()
            swap_in(self.block_manager, seq_group, out.blocks_to_swap_in)
            append_slots(self.block_manager, seq_group)
            if seq_group.is_prefill():
                out.prefill_seq_groups.append(ScheduledSequenceGroup(seq_group, num_new_tokens))
            else:
                out.decode_seq_groups.append(ScheduledSequenceGroup(seq_group, 1))
            budget.add_num_batched_tokens(seq_group.request_id, num_new_tokens)
            budget.add_num_seqs(seq_group.request_id, num_new_seqs)
        return swapped_queue, out

    def _probe_head_of_line(
        self,
        head: SequenceGroup,
        waiting_queue: deque[SequenceGroup],
        budget: SchedulingBudget,
        enable_chunking: bool,
        prompt_limit: int,
        alloc_later: bool,
    ) -> None:
        """Rule 2's starvation probe (engine/v0/starvation.py): what waits behind a blocked head."""
        behind = islice(waiting_queue, 1, None)
        probe_head_of_line(
            self.starvation, self.block_manager, prompt_limit, head, behind, budget, enable_chunking, alloc_later
        )

    def _schedule_prefills(
        self, waiting_queue: deque[SequenceGroup], budget: SchedulingBudget, enable_chunking: bool = False
    ) -> tuple[deque[SequenceGroup], SchedulerPrefillOutputs]:
        out = SchedulerPrefillOutputs()
        waiting_queue = deque(waiting_queue)  # the caller's queue stays untouched
        while waiting_queue:
            seq_group = waiting_queue[0]
            waiting_seqs = seq_group.get_seqs(status=SequenceStatus.WAITING)
            assert len(waiting_seqs) == 1, "Waiting sequence group should have only one prompt sequence."
            num_new_tokens = self._get_num_new_tokens(seq_group, SequenceStatus.WAITING, enable_chunking, budget)
            if not enable_chunking:
                assert num_new_tokens == waiting_seqs[0].get_len()
            # Rule 3 (with chunking the check sees the chunk, as in vLLM).
            prompt_limit = self._get_prompt_limit(seq_group)
            if num_new_tokens > prompt_limit:
                logger.warning(format_prompt_too_long(num_new_tokens, prompt_limit))
                self._ignore(seq_group, out, waiting_queue)
                continue
            can_allocate = self.block_manager.can_allocate(seq_group)
            if can_allocate == AllocStatus.LATER:  # rule 2: head-of-line blocking
                self._probe_head_of_line(seq_group, waiting_queue, budget, enable_chunking, prompt_limit, True)
                break
            if can_allocate == AllocStatus.NEVER:
                logger.warning(format_prompt_exceeds_capacity(num_new_tokens))
                self._ignore(seq_group, out, waiting_queue)
                continue
            num_new_seqs = seq_group.get_max_num_running_seqs()
            if num_new_tokens == 0 or not budget.can_schedule(num_new_tokens=num_new_tokens, num_new_seqs=num_new_seqs):
                self._probe_head_of_line(seq_group, waiting_queue, budget, enable_chunking, prompt_limit, False)
                break
            waiting_queue.popleft()
            allocate_and_set_running(self.block_manager, seq_group)
            out.seq_groups.append(ScheduledSequenceGroup(seq_group, num_new_tokens))
            budget.add_num_batched_tokens(seq_group.request_id, num_new_tokens)
            budget.add_num_seqs(seq_group.request_id, num_new_seqs)
        return waiting_queue, out

    @staticmethod
    def _ignore(seq_group: SequenceGroup, out: SchedulerPrefillOutputs, waiting_queue: deque[SequenceGroup]) -> None:
        for seq in seq_group.get_seqs(status=SequenceStatus.WAITING):
            seq.status = SequenceStatus.FINISHED_IGNORED
        out.ignored_seq_groups.append(seq_group)
        waiting_queue.popleft()

    # -- what a group asks of the budget -------------------------------------------
    def _get_prompt_limit(self, seq_group: SequenceGroup | None = None) -> int:
        cfg = self.scheduler_config
        if cfg.enable_chunked_prefill:
            return cfg.max_model_len
        assert cfg.max_num_batched_tokens is not None  # resolved by SchedulerConfig.__post_init__
        return min(cfg.max_model_len, cfg.max_num_batched_tokens)

    def _get_num_new_tokens(
        self, seq_group: SequenceGroup, status: SequenceStatus, enable_chunking: bool, budget: SchedulingBudget
    ) -> int:
        """The group's new tokens; with chunking, cut to the budget left (may be 0)."""
        seqs = seq_group.get_seqs(status=status)
        num_new_tokens = sum(seq.get_num_new_tokens() for seq in seqs)
        assert num_new_tokens > 0
        if enable_chunking and len(seqs) == 1:
            num_new_tokens = min(num_new_tokens, budget.remaining_token_budget())
        return num_new_tokens
