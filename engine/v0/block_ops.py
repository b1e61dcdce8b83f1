"""The v0 `Scheduler`'s block bookkeeping (vLLM 0.5.3.post1
`vllm/core/scheduler.py`): allocating a prefill's blocks, appending decode
slots, freeing finished groups, and preempting — by recompute (blocks
dropped, the sequence prefilled again) or by swapping to the CPU pool — and
swapping back in. A mixin of `engine.v0.scheduler.Scheduler`, kept apart
from the three scheduling phases that decide who is served."""

from __future__ import annotations

import enum
import logging
from collections import deque
from typing import TYPE_CHECKING

from engine.v0.loglines import LOGGER_NAME, format_preemption_warning, should_warn_preemption
from engine.v0.sequence import Sequence, SequenceGroup, SequenceStatus

if TYPE_CHECKING:
    from engine.v0.scheduler import Scheduler

logger = logging.getLogger(LOGGER_NAME)


class PreemptionMode(enum.Enum):
    """SWAP: blocks move to the CPU pool. RECOMPUTE: blocks are dropped and the
    sequence is prefilled again (prompt + outputs so far)."""

    SWAP = enum.auto()
    RECOMPUTE = enum.auto()


class BlockOpsMixin:
    # `self` is the v0 Scheduler: the attributes used here are its own.
    def free_seq(self: Scheduler, seq: Sequence) -> None:  # type: ignore[misc]
        self.block_manager.free(seq)

    def free_finished_seq_groups(self: Scheduler) -> None:  # type: ignore[misc]
        # vLLM also scans `swapped` and `waiting`, but here a group there is never
        # finished (aborts remove it, ignored prompts are popped): skipping the
        # scan keeps a long backlog cheap and changes nothing.
        finished = [g.request_id for g in self.running if g.seqs[0].status > SequenceStatus.SWAPPED]
        if finished:
            self._finished_requests_ids += finished
            self.running = deque(g for g in self.running if not g.is_finished())

    def _allocate_and_set_running(self: Scheduler, seq_group: SequenceGroup) -> None:  # type: ignore[misc]
        self.block_manager.allocate(seq_group)
        for seq in seq_group.get_seqs(status=SequenceStatus.WAITING):
            seq.status = SequenceStatus.RUNNING

    def _append_slots(self: Scheduler, seq_group: SequenceGroup) -> None:  # type: ignore[misc]
        for seq in seq_group.get_seqs(status=SequenceStatus.RUNNING):
            self.block_manager.append_slots(seq)

    def _preempt(  # type: ignore[misc]
        self: Scheduler, seq_group: SequenceGroup, blocks_to_swap_out: list[tuple[int, int]]
    ) -> PreemptionMode:
        if self.user_specified_preemption_mode is None:
            # One running sequence can be recomputed; vLLM swaps multi-sequence groups.
            mode = PreemptionMode.RECOMPUTE if seq_group.get_max_num_running_seqs() == 1 else PreemptionMode.SWAP
        elif self.user_specified_preemption_mode == "swap":
            mode = PreemptionMode.SWAP
        else:
            mode = PreemptionMode.RECOMPUTE
        if should_warn_preemption(self.num_cumulative_preemption):
            logger.warning(format_preemption_warning(seq_group.request_id, mode, self.num_cumulative_preemption + 1))
        self.num_cumulative_preemption += 1
        self.num_preemptions_by_mode[mode] += 1
        if mode is PreemptionMode.RECOMPUTE:
            self._preempt_by_recompute(seq_group)
        else:
            self._swap_out(seq_group, blocks_to_swap_out)
        return mode

    def _preempt_by_recompute(self: Scheduler, seq_group: SequenceGroup) -> None:  # type: ignore[misc]
        seqs = seq_group.get_seqs(status=SequenceStatus.RUNNING)
        assert len(seqs) == 1
        for seq in seqs:
            seq.status = SequenceStatus.WAITING
            self.free_seq(seq)
            seq.reset_state_for_recompute()

    def _swap_in(self: Scheduler, seq_group: SequenceGroup, blocks_to_swap_in: list[tuple[int, int]]) -> None:  # type: ignore[misc]
        blocks_to_swap_in.extend(self.block_manager.swap_in(seq_group))
        for seq in seq_group.get_seqs(status=SequenceStatus.SWAPPED):
            seq.status = SequenceStatus.RUNNING

    def _swap_out(self: Scheduler, seq_group: SequenceGroup, blocks_to_swap_out: list[tuple[int, int]]) -> None:  # type: ignore[misc]
        if not self.block_manager.can_swap_out(seq_group):
            # vLLM aborts the whole engine here; there is no fallback to recompute.
            raise RuntimeError(
                "Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this error."
            )
        blocks_to_swap_out.extend(self.block_manager.swap_out(seq_group))
        for seq in seq_group.get_seqs(status=SequenceStatus.RUNNING):
            seq.status = SequenceStatus.SWAPPED
