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

from engine.v0.policy import PolicyFactory
from engine.v0.scheduler_outputs import (
    SchedulerOutputs,
    SchedulerPrefillOutputs,
    SchedulerRunningOutputs,
    SchedulerSwappedInOutputs,
    SchedulingBudget,
    SequenceGroupMetadata,
)
from engine.v0.scheduler_phases import SchedulerPhases
from engine.v0.sequence import Sequence, SequenceStage, SequenceStatus
from engine.v0.starvation import probe_swap_priority, record_reinsertions


def samples(seq: Sequence, is_prompt: bool, token_chunk_size: int) -> bool:
    """`do_sample`: a prefill chunk that stops short of the sequence's end samples nothing."""
    return not is_prompt or token_chunk_size + seq._num_computed_tokens >= seq._len


class Scheduler(SchedulerPhases):
    """vLLM 0.5.3.post1's v0 scheduler: its state and queue operations
    (`SchedulerQueues`, engine/v0/scheduler_queues.py), its three phases
    (`SchedulerPhases`, engine/v0/scheduler_phases.py), and here the two step
    shapes that run them and `schedule()`."""

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
