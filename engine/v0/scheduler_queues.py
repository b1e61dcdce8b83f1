"""The state of the legacy v0 `Scheduler` (engine/v0/scheduler.py) and its
queue operations, as in vLLM 0.5.3.post1's `vllm/core/scheduler.py`: the
`waiting`, `running` and `swapped` queues, adding, aborting and freeing
groups, and preempting one (counted and warned about as vLLM does)."""

from __future__ import annotations

import logging
from collections import deque

from engine.v0.block_manager import BlockSpaceManagerV1
from engine.v0.block_ops import PreemptionMode, preempt_by_recompute, preemption_mode, swap_out
from engine.v0.config import CacheConfig, SchedulerConfig
from engine.v0.loglines import (
    LOGGER_NAME,
    format_chunked_prefill_enabled,
    format_preemption_warning,
    should_warn_preemption,
)
from engine.v0.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.v0.starvation import StarvationCounters

logger = logging.getLogger(LOGGER_NAME)


class SchedulerQueues:
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
