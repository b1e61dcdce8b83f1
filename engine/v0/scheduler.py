"""The legacy v0 `Scheduler` of vLLM 0.5.3.post1 (`vllm/core/scheduler.py`),
FCFS only, default (v1) block manager, n=1 sequences, no prefix caching, no
LoRA, `delay_factor` 0. Time never comes from a clock: `schedule(now)`.

The order rules that decide who is served (docs/reference.md, "v0: The six order rules"):
1. `add_seq_group` appends to `waiting`;
2. prefills are taken from the head of `waiting`, and the pass stops (`break`)
   at the first head whose allocation is LATER or that the budget cannot take;
3. a prompt over `prompt_limit` is FINISHED_IGNORED, popped, and the pass goes on;
4. the preemption victim is the tail of `running` (sorted by arrival);
5. recomputed victims go back to the head of `waiting` (`extendleft`);
6. without chunked prefill, no prefill at all while `swapped` is non-empty.
"""

from __future__ import annotations

import logging
from collections import deque
from itertools import islice

from engine.v0.block_manager import AllocStatus, BlockSpaceManagerV1
from engine.v0.block_ops import (
    PreemptionMode,
    allocate_and_set_running,
    append_slots,
    preempt_by_recompute,
    preemption_mode,
    swap_in,
    swap_out,
)
from engine.v0.config import CacheConfig, SchedulerConfig
from engine.v0.loglines import (
    LOGGER_NAME,
    format_chunked_prefill_enabled,
    format_preemption_warning,
    format_prompt_exceeds_capacity,
    format_prompt_too_long,
    format_swap_in_infeasible,
    should_warn_preemption,
)
from engine.v0.policy import Policy, PolicyFactory
from engine.v0.scheduler_outputs import (
    ScheduledSequenceGroup,
    SchedulerOutputs,
    SchedulerPrefillOutputs,
    SchedulerRunningOutputs,
    SchedulerSwappedInOutputs,
    SchedulingBudget,
    SequenceGroupMetadata,
)
from engine.v0.sequence import Sequence, SequenceGroup, SequenceStage, SequenceStatus
from engine.v0.starvation import (
    StarvationCounters,
    probe_head_of_line,
    probe_swap_priority,
    record_reinsertions,
)

logger = logging.getLogger(LOGGER_NAME)


def samples(seq: Sequence, is_prompt: bool, token_chunk_size: int) -> bool:
    """`do_sample`: a prefill chunk that stops short of the sequence's end samples nothing."""
    return not is_prompt or token_chunk_size + seq._num_computed_tokens >= seq._len


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.block_manager = BlockSpaceManagerV1(
            cache_config.block_size, cache_config.num_gpu_blocks, cache_config.num_cpu_blocks, cache_config.watermark
        )
        self.waiting: deque[SequenceGroup] = deque()
        self.running: deque[SequenceGroup] = deque()
        self.swapped: deque[SequenceGroup] = deque()
        self._finished_requests_ids: list[str] = []
        self.user_specified_preemption_mode = scheduler_config.preemption_mode
        self.num_cumulative_preemption = 0
        self.num_preemptions_by_mode = {PreemptionMode.RECOMPUTE: 0, PreemptionMode.SWAP: 0}
        self.num_ignored_seq_groups = 0
        self.starvation = StarvationCounters()
        self._now = 0.0
        assert scheduler_config.max_num_batched_tokens is not None  # resolved by SchedulerConfig.__post_init__
        if scheduler_config.enable_chunked_prefill:
            logger.info(format_chunked_prefill_enabled(scheduler_config.max_num_batched_tokens))

    # -- queues ----------------------------------------------------------------
    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        self.waiting.append(seq_group)

    def abort_seq_group(
        self, request_id: str | list[str] | set[str], status: SequenceStatus = SequenceStatus.FINISHED_ABORTED
    ) -> None:
        """Removes the groups from whichever queue holds them and frees their blocks."""
        request_ids = {request_id} if isinstance(request_id, str) else set(request_id)
        for queue in (self.waiting, self.running, self.swapped):
            aborted = [g for g in queue if g.request_id in request_ids]
            for g in aborted:
                queue.remove(g)
                request_ids.discard(g.request_id)
                self._finished_requests_ids.append(g.request_id)
                for seq in g.get_seqs():
                    if not seq.is_finished():
                        seq.status = status
                        self.free_seq(seq)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def get_num_unfinished_seq_groups(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def get_and_reset_finished_requests_ids(self) -> list[str]:
        ids, self._finished_requests_ids = self._finished_requests_ids, []
        return ids

    def free_seq(self, seq: Sequence) -> None:
        self.block_manager.free(seq)

    def free_finished_seq_groups(self) -> None:
        # vLLM also scans `swapped` and `waiting`, but here a group there is never
        # finished (aborts remove it, ignored prompts are popped): skipping the
        # scan keeps a long backlog cheap and changes nothing.
        finished = [g.request_id for g in self.running if g.seqs[0].status > SequenceStatus.SWAPPED]
        if finished:
            self._finished_requests_ids += finished
            self.running = deque(g for g in self.running if not g.is_finished())

    def _preempt(self, seq_group: SequenceGroup, blocks_to_swap_out: list[tuple[int, int]]) -> PreemptionMode:
        """Preempt a running group (engine/v0/block_ops.py moves its blocks),
        counted and warned about as vLLM does."""
        mode = preemption_mode(self.user_specified_preemption_mode, seq_group)
        if should_warn_preemption(self.num_cumulative_preemption):
            logger.warning(format_preemption_warning(seq_group.request_id, mode, self.num_cumulative_preemption + 1))
        self.num_cumulative_preemption += 1
        self.num_preemptions_by_mode[mode] += 1
        if mode is PreemptionMode.RECOMPUTE:
            preempt_by_recompute(self.block_manager, seq_group)
        else:
            swap_out(self.block_manager, seq_group, blocks_to_swap_out)
        return mode

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

    def _get_prompt_limit(self, seq_group: SequenceGroup | None = None) -> int:
        cfg = self.scheduler_config
        if cfg.enable_chunked_prefill:
            return cfg.max_model_len
        assert cfg.max_num_batched_tokens is not None  # resolved by SchedulerConfig.__post_init__
        return min(cfg.max_model_len, cfg.max_num_batched_tokens)

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

    # -- the two step shapes -------------------------------------------------------
    def _schedule_default(self) -> SchedulerOutputs:
        """All prefills or all decodes: prefills first (only if nothing is swapped),
        decodes only if no prefill was scheduled, swap-in only if nothing was preempted."""
        cfg = self.scheduler_config
        assert cfg.max_num_batched_tokens is not None  # resolved by SchedulerConfig.__post_init__
        budget = SchedulingBudget(cfg.max_num_batched_tokens, cfg.max_num_seqs)
        budget.add_num_seqs_of(self.running)
        remaining_waiting, prefills = self.waiting, SchedulerPrefillOutputs()
        remaining_running, running_scheduled = self.running, SchedulerRunningOutputs()
        remaining_swapped, swapped_in = self.swapped, SchedulerSwappedInOutputs()

        if not self.swapped:  # rule 6
            remaining_waiting, prefills = self._schedule_prefills(self.waiting, budget, enable_chunking=False)
        elif self.waiting:
            probe_swap_priority(self.starvation, self.block_manager, self._get_prompt_limit(), self.waiting, budget)

        fcfs_policy = PolicyFactory.get_policy(policy_name="fcfs")
        if len(prefills.seq_groups) == 0:
            remaining_running, running_scheduled = self._schedule_running(self.running, budget, fcfs_policy)
            if len(running_scheduled.preempted) + len(running_scheduled.swapped_out) == 0:
                remaining_swapped, swapped_in = self._schedule_swapped(self.swapped, budget, fcfs_policy)

        assert budget.num_batched_tokens <= cfg.max_num_batched_tokens
        assert budget.num_curr_seqs <= cfg.max_num_seqs
        record_reinsertions(self.starvation, running_scheduled.preempted, remaining_waiting)
        self.waiting = remaining_waiting
        self.waiting.extendleft(running_scheduled.preempted)  # rule 5
        self.running = remaining_running
        self.running.extend(s.seq_group for s in prefills.seq_groups)
        self.running.extend(s.seq_group for s in running_scheduled.decode_seq_groups)
        self.running.extend(s.seq_group for s in swapped_in.decode_seq_groups)
        self.swapped = remaining_swapped
        self.swapped.extend(running_scheduled.swapped_out)
        assert not running_scheduled.prefill_seq_groups and not swapped_in.prefill_seq_groups
        return self._outputs(prefills, running_scheduled, swapped_in, budget)

    def _schedule_chunked_prefill(self) -> SchedulerOutputs:
        """Decodes and running prefill chunks first, then swap-in (if nothing was
        preempted), then new prefills chunked into what is left of the budget --
        prefills run even while `swapped` is non-empty."""
        cfg = self.scheduler_config
        assert cfg.max_num_batched_tokens is not None  # resolved by SchedulerConfig.__post_init__
        budget = SchedulingBudget(cfg.max_num_batched_tokens, cfg.max_num_seqs)
        remaining_swapped, swapped_in = self.swapped, SchedulerSwappedInOutputs()
        fcfs_policy = PolicyFactory.get_policy(policy_name="fcfs")
        remaining_running, running_scheduled = self._schedule_running(
            self.running, budget, fcfs_policy, enable_chunking=True
        )
        if len(running_scheduled.preempted) + len(running_scheduled.swapped_out) == 0:
            remaining_swapped, swapped_in = self._schedule_swapped(self.swapped, budget, fcfs_policy)
        remaining_waiting, prefills = self._schedule_prefills(self.waiting, budget, enable_chunking=True)

        assert budget.num_batched_tokens <= cfg.max_num_batched_tokens
        assert budget.num_curr_seqs <= cfg.max_num_seqs
        record_reinsertions(self.starvation, running_scheduled.preempted, remaining_waiting)
        self.waiting = remaining_waiting
        self.waiting.extendleft(running_scheduled.preempted)
        self.running = remaining_running
        self.running.extend(s.seq_group for s in prefills.seq_groups)
        self.running.extend(s.seq_group for s in running_scheduled.decode_seq_groups)
        self.running.extend(s.seq_group for s in running_scheduled.prefill_seq_groups)
        self.running.extend(s.seq_group for s in swapped_in.decode_seq_groups)
        self.running.extend(s.seq_group for s in swapped_in.prefill_seq_groups)
        self.swapped = remaining_swapped
        self.swapped.extend(running_scheduled.swapped_out)
        return self._outputs(prefills, running_scheduled, swapped_in, budget)

    def _outputs(
        self,
        prefills: SchedulerPrefillOutputs,
        running: SchedulerRunningOutputs,
        swapped_in: SchedulerSwappedInOutputs,
        budget: SchedulingBudget,
    ) -> SchedulerOutputs:
        return SchedulerOutputs(
            scheduled_seq_groups=(
                prefills.seq_groups
                + running.prefill_seq_groups
                + swapped_in.prefill_seq_groups
                + running.decode_seq_groups
                + swapped_in.decode_seq_groups
            ),
            num_prefill_groups=(
                len(prefills.seq_groups) + len(swapped_in.prefill_seq_groups) + len(running.prefill_seq_groups)
            ),
            num_batched_tokens=budget.num_batched_tokens,
            blocks_to_swap_in=swapped_in.blocks_to_swap_in,
            blocks_to_swap_out=running.blocks_to_swap_out,
            blocks_to_copy=running.blocks_to_copy + swapped_in.blocks_to_copy,
            ignored_seq_groups=prefills.ignored_seq_groups + swapped_in.infeasible_seq_groups,
            num_lookahead_slots=0,
            running_queue_size=len(self.running),
            preempted=len(running.preempted) + len(running.swapped_out),
            preempted_seq_groups=list(running.preempted),
            swapped_out_seq_groups=list(running.swapped_out),
            swapped_in_seq_groups=[s.seq_group for s in swapped_in.prefill_seq_groups + swapped_in.decode_seq_groups],
        )

    def _schedule(self) -> SchedulerOutputs:
        if self.scheduler_config.enable_chunked_prefill:
            out = self._schedule_chunked_prefill()
        else:
            out = self._schedule_default()
        self.num_ignored_seq_groups += len(out.ignored_seq_groups)
        return out

    def schedule_outputs(self, now: float = 0.0) -> SchedulerOutputs:
        """The pass of `schedule()` without the per-group metadata (the v1-shaped
        adapter derives what it needs itself; this saves an object per group)."""
        self._now = now
        scheduler_outputs = self._schedule()
        for scheduled in scheduler_outputs.scheduled_seq_groups:
            seq_group = scheduled.seq_group
            if seq_group.first_scheduled_time is None:
                seq_group.first_scheduled_time = now
        return scheduler_outputs

    def schedule(self, now: float = 0.0) -> tuple[list[SequenceGroupMetadata], SchedulerOutputs]:
        """One scheduling pass. `now` orders running/swapped (FCFS priority is
        `now - arrival_time`) and stamps first-scheduled times. Each metadata's
        block table is the block manager's own list (vLLM hands out a copy):
        read it before the next pass changes it."""
        scheduler_outputs = self.schedule_outputs(now)
        metadata: list[SequenceGroupMetadata] = []
        tables = self.block_manager.block_tables
        for scheduled in scheduler_outputs.scheduled_seq_groups:
            seq_group = scheduled.seq_group
            seq = seq_group.seqs[0]
            is_prompt = seq._stage is SequenceStage.PREFILL
            metadata.append(
                SequenceGroupMetadata(
                    seq_group.request_id,
                    is_prompt,
                    samples(seq, is_prompt, scheduled.token_chunk_size),
                    scheduled.token_chunk_size,
                    {seq.seq_id: tables[seq.seq_id]} if seq.status is SequenceStatus.RUNNING else {},
                )
            )
        return metadata, scheduler_outputs

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
