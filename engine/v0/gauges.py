"""What the v0 gauges (`vllm:num_requests_waiting/running/swapped`, GPU and CPU
cache usage) did over a whole run, as integers a results file can sum or max
over nodes.

vLLM samples its gauges once per engine step (`LLMEngine._get_stats` after the
step); `QueueGauges.sample` is called at the same point. A report needs more
than the last sample, because a finite workload always ends with empty queues:
- peaks (`*_peak`, aggregated by max over nodes);
- per-step sums, from which means follow (divide by `v0_num_steps`);
- how long the waiting queue stayed non-empty without a break: a queue that
  "never drains" stays non-empty for most of the run; one that keeps up
  empties between arrivals. Measured on the scheduler's clock, in ms.
"""

from __future__ import annotations


class QueueGauges:
    def __init__(self) -> None:
        self.num_steps = 0
        self.num_running_peak = 0
        self.num_waiting_peak = 0
        self.num_swapped_peak = 0
        self.gpu_blocks_used_peak = 0
        self.cpu_blocks_used_peak = 0
        self.swapped_request_steps = 0
        self.cpu_blocks_used_steps = 0
        # The current stretch of non-empty `waiting` started here (None: empty).
        self._waiting_since: float | None = None
        self.waiting_nonempty_longest = 0.0
        self.waiting_drains = 0

    def sample(
        self,
        now: float,
        num_running: int,
        num_waiting: int,
        num_swapped: int,
        gpu_blocks_used: int,
        cpu_blocks_used: int,
    ) -> None:
        self.num_steps += 1
        if num_running > self.num_running_peak:
            self.num_running_peak = num_running
        if num_waiting > self.num_waiting_peak:
            self.num_waiting_peak = num_waiting
        if num_swapped > self.num_swapped_peak:
            self.num_swapped_peak = num_swapped
        if gpu_blocks_used > self.gpu_blocks_used_peak:
            self.gpu_blocks_used_peak = gpu_blocks_used
        if cpu_blocks_used > self.cpu_blocks_used_peak:
            self.cpu_blocks_used_peak = cpu_blocks_used
        self.swapped_request_steps += num_swapped
        self.cpu_blocks_used_steps += cpu_blocks_used
        if num_waiting:
            if self._waiting_since is None:
                self._waiting_since = now
        elif self._waiting_since is not None:
            self._close_stretch(now)
            self.waiting_drains += 1

    def _close_stretch(self, now: float) -> None:
        assert self._waiting_since is not None  # only called with a stretch open
        self.waiting_nonempty_longest = max(self.waiting_nonempty_longest, now - self._waiting_since)
        self._waiting_since = None

    def longest_nonempty_waiting(self, now: float) -> float:
        """Seconds; a stretch still open at `now` counts up to `now`."""
        if self._waiting_since is None:
            return self.waiting_nonempty_longest
        return max(self.waiting_nonempty_longest, now - self._waiting_since)

    def counters(self, now: float) -> dict[str, int]:
        return {
            "v0_num_steps": self.num_steps,
            "v0_num_running_peak": self.num_running_peak,
            "v0_num_waiting_peak": self.num_waiting_peak,
            "v0_num_swapped_peak": self.num_swapped_peak,
            "v0_gpu_blocks_used_peak": self.gpu_blocks_used_peak,
            "v0_cpu_blocks_used_peak": self.cpu_blocks_used_peak,
            "v0_swapped_request_steps": self.swapped_request_steps,
            "v0_cpu_blocks_used_steps": self.cpu_blocks_used_steps,
            "v0_waiting_nonempty_ms_peak": round(self.longest_nonempty_waiting(now) * 1000),
            "v0_waiting_drains": self.waiting_drains,
        }
