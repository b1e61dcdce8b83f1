"""What a scheduler counts for reports: preemptions and the ones that freed
nothing, allocator calls, and the deferred-free pool."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SchedulerCounters:
    num_preemptions: int = 0
    # A preemption whose victim's blocks went to `deferred_frees` instead of the
    # free queue: every side effect of a preemption, no capacity gained.
    num_zero_progress_preemptions: int = 0
    num_allocate_slots_calls: int = 0
    deferred_free_blocks: int = 0
    deferred_free_blocks_peak: int = 0
    num_blocks_freed_by_drain: int = 0
    # Retries stopped by the fence guard (PR #49675) before any mutation.
    num_fence_stopped_retries: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)
