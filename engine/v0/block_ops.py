"""The v0 `Scheduler`'s block moves (vLLM 0.5.3.post1 `vllm/core/scheduler.py`):
allocating a prefill's blocks, appending decode slots, and the two ways to
preempt — by recompute (blocks dropped, the sequence prefilled again) or by
swapping to the CPU pool — and swapping back in. Functions over the block
manager, kept apart from the three scheduling phases that decide who is
served; the scheduler keeps the preemption policy and its counters
(`Scheduler._preempt`)."""

from __future__ import annotations

import enum

from engine.v0.block_manager import BlockSpaceManagerV1
from engine.v0.sequence import SequenceGroup, SequenceStatus


class PreemptionMode(enum.Enum):
    """SWAP: blocks move to the CPU pool. RECOMPUTE: blocks are dropped and the
    sequence is prefilled again (prompt + outputs so far)."""

    SWAP = enum.auto()
    RECOMPUTE = enum.auto()


def preemption_mode(user_specified: str | None, seq_group: SequenceGroup) -> PreemptionMode:
    if user_specified is None:
        # One running sequence can be recomputed; vLLM swaps multi-sequence groups.
        return PreemptionMode.RECOMPUTE if seq_group.get_max_num_running_seqs() == 1 else PreemptionMode.SWAP
    if user_specified == "swap":
        return PreemptionMode.SWAP
    return PreemptionMode.RECOMPUTE


def allocate_and_set_running(bm: BlockSpaceManagerV1, seq_group: SequenceGroup) -> None:
    bm.allocate(seq_group)
    for seq in seq_group.get_seqs(status=SequenceStatus.WAITING):
        seq.status = SequenceStatus.RUNNING


def append_slots(bm: BlockSpaceManagerV1, seq_group: SequenceGroup) -> None:
    for seq in seq_group.get_seqs(status=SequenceStatus.RUNNING):
        bm.append_slots(seq)


def preempt_by_recompute(bm: BlockSpaceManagerV1, seq_group: SequenceGroup) -> None:
    seqs = seq_group.get_seqs(status=SequenceStatus.RUNNING)
    assert len(seqs) == 1
    for seq in seqs:
        seq.status = SequenceStatus.WAITING
        bm.free(seq)
        seq.reset_state_for_recompute()


def swap_in(bm: BlockSpaceManagerV1, seq_group: SequenceGroup, blocks_to_swap_in: list[tuple[int, int]]) -> None:
    blocks_to_swap_in.extend(bm.swap_in(seq_group))
    for seq in seq_group.get_seqs(status=SequenceStatus.SWAPPED):
        seq.status = SequenceStatus.RUNNING


def swap_out(bm: BlockSpaceManagerV1, seq_group: SequenceGroup, blocks_to_swap_out: list[tuple[int, int]]) -> None:
    if not bm.can_swap_out(seq_group):
        # vLLM aborts the whole engine here; there is no fallback to recompute.
        raise RuntimeError(
            "Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this error."
        )
    blocks_to_swap_out.extend(bm.swap_out(seq_group))
    for seq in seq_group.get_seqs(status=SequenceStatus.RUNNING):
        seq.status = SequenceStatus.SWAPPED
