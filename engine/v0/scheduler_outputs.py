"""The v0 scheduler's budget and result records (vLLM 0.5.3.post1
`vllm/core/scheduler.py`): `SchedulingBudget`, `ScheduledSequenceGroup`,
`SchedulerOutputs`, the three per-phase outputs, and the slim
`SequenceGroupMetadata` that `schedule()` returns beside them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.v0.sequence import SequenceGroup, SequenceStatus


@dataclass
class SchedulingBudget:
    """Token and sequence budget of one pass. Request-id aware, like vLLM's: a
    second add for the same request is ignored, because the default path pre-adds
    every running group's sequences before scheduling it."""

    token_budget: int
    max_num_seqs: int
    _request_ids_num_batched_tokens: set[str] = field(default_factory=set)
    _request_ids_num_curr_seqs: set[str] = field(default_factory=set)
    _num_batched_tokens: int = 0
    _num_curr_seqs: int = 0

    def can_schedule(self, *, num_new_tokens: int, num_new_seqs: int) -> bool:
        assert num_new_tokens != 0 and num_new_seqs != 0
        return (
            self._num_batched_tokens + num_new_tokens <= self.token_budget
            and self._num_curr_seqs + num_new_seqs <= self.max_num_seqs
        )

    def remaining_token_budget(self) -> int:
        return self.token_budget - self._num_batched_tokens

    def add_num_batched_tokens(self, req_id: str, num_batched_tokens: int) -> None:
        if req_id not in self._request_ids_num_batched_tokens:
            self._request_ids_num_batched_tokens.add(req_id)
            self._num_batched_tokens += num_batched_tokens

    def subtract_num_batched_tokens(self, req_id: str, num_batched_tokens: int) -> None:
        if req_id in self._request_ids_num_batched_tokens:
            self._request_ids_num_batched_tokens.remove(req_id)
            self._num_batched_tokens -= num_batched_tokens

    def add_num_seqs(self, req_id: str, num_curr_seqs: int) -> None:
        if req_id not in self._request_ids_num_curr_seqs:
            self._request_ids_num_curr_seqs.add(req_id)
            self._num_curr_seqs += num_curr_seqs

    def add_num_seqs_of(self, seq_groups: Iterable[SequenceGroup]) -> None:
        """`add_num_seqs` for every group (the default path's pre-add of `running`),
        in one loop: n=1, so an unfinished group adds one sequence, a finished one none."""
        ids = self._request_ids_num_curr_seqs
        swapped = SequenceStatus.SWAPPED
        added = 0
        for g in seq_groups:
            rid = g.request_id
            if rid not in ids:
                ids.add(rid)
                if g.seqs[0].status <= swapped:  # not g.is_finished()
                    added += 1
        self._num_curr_seqs += added

    def subtract_num_seqs(self, req_id: str, num_curr_seqs: int) -> None:
        if req_id in self._request_ids_num_curr_seqs:
            self._request_ids_num_curr_seqs.remove(req_id)
            self._num_curr_seqs -= num_curr_seqs

    @property
    def num_batched_tokens(self) -> int:
        return self._num_batched_tokens

    @property
    def num_curr_seqs(self) -> int:
        return self._num_curr_seqs


@dataclass(slots=True)
class ScheduledSequenceGroup:
    seq_group: SequenceGroup
    # 1 for a decode; the prompt (or its chunk) for a prefill.
    token_chunk_size: int


@dataclass
class SchedulerOutputs:
    """What one `schedule()` decided. Prefill groups come first in
    `scheduled_seq_groups`; `preempted` counts recomputed plus swapped-out groups.
    `preempted_seq_groups` / `swapped_out_seq_groups` (in victim order) and
    `swapped_in_seq_groups` are simulator extras for traces, the v1-shaped
    adapter and the starvation counters."""

    scheduled_seq_groups: list[ScheduledSequenceGroup]
    num_prefill_groups: int
    num_batched_tokens: int
    blocks_to_swap_in: list[tuple[int, int]]
    blocks_to_swap_out: list[tuple[int, int]]
    blocks_to_copy: list[tuple[int, int]]
    ignored_seq_groups: list[SequenceGroup]
    num_lookahead_slots: int
    running_queue_size: int
    preempted: int
    preempted_seq_groups: list[SequenceGroup] = field(default_factory=list)
    swapped_out_seq_groups: list[SequenceGroup] = field(default_factory=list)
    swapped_in_seq_groups: list[SequenceGroup] = field(default_factory=list)

    def __post_init__(self) -> None:
        # vLLM asserts this too: a pass never swaps in and out at once.
        assert not (self.blocks_to_swap_in and self.blocks_to_swap_out)

    def is_empty(self) -> bool:
        # Like vLLM, ignored groups do not make an output non-empty.
        return (
            not self.scheduled_seq_groups
            and not self.blocks_to_swap_in
            and not self.blocks_to_swap_out
            and not self.blocks_to_copy
        )


@dataclass
class SchedulerRunningOutputs:
    decode_seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    # Running groups still in prefill: only with chunked prefill.
    prefill_seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)
    swapped_out: list[SequenceGroup] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    num_lookahead_slots: int = 0


@dataclass
class SchedulerSwappedInOutputs:
    decode_seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    prefill_seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    num_lookahead_slots: int = 0
    # Swapped groups that can never fit back (AllocStatus.NEVER): ignored.
    infeasible_seq_groups: list[SequenceGroup] = field(default_factory=list)


@dataclass
class SchedulerPrefillOutputs:
    seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    ignored_seq_groups: list[SequenceGroup] = field(default_factory=list)
    num_lookahead_slots: int = 0


@dataclass(slots=True)
class SequenceGroupMetadata:
    """What the worker is told per scheduled group. `do_sample` is False for a
    prefill chunk that does not reach the end of the sequence."""

    request_id: str
    is_prompt: bool
    do_sample: bool
    token_chunk_size: int
    block_tables: dict[int, list[int]]
