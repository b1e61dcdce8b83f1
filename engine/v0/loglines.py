"""vLLM 0.5.3.post1's v0 log lines: pure formatters (exact wording, same
`%`-formats as vLLM) and a periodic stats logger driven by a time passed in.

Everything is emitted through Python `logging` under the logger name "vllm.v0";
the runtime decides when (e.g. `V0StatLogger.maybe_log(stats)` after every step,
which prints once per 5 s interval like vLLM's `LoggingStatLogger`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

LOGGER_NAME = "vllm.v0"
logger = logging.getLogger(LOGGER_NAME)

# vLLM: `_LOCAL_LOGGING_INTERVAL_SEC = 5`.
LOCAL_LOGGING_INTERVAL_SEC = 5.0

# The preemption warning is printed for the 1st, 51st, 101st ... preemption.
PREEMPTION_WARNING_EVERY = 50


def format_num_blocks(num_gpu_blocks: int, num_cpu_blocks: int) -> str:
    return "# GPU blocks: %d, # CPU blocks: %d" % (num_gpu_blocks, num_cpu_blocks)


def format_chunked_prefill_enabled(max_num_batched_tokens: int) -> str:
    return "Chunked prefill is enabled with max_num_batched_tokens=%d." % max_num_batched_tokens


def format_prompt_too_long(num_tokens: int, prompt_limit: int) -> str:
    return "Input prompt (%d tokens) is too long and exceeds limit of %d" % (num_tokens, prompt_limit)


def format_prompt_exceeds_capacity(num_tokens: int) -> str:
    return "Input prompt (%d tokens) is too long and exceeds the capacity of block_manager" % num_tokens


def format_swap_in_infeasible(request_id: str) -> str:
    return "Failing the request %s because there's not enough kv cache blocks to run the entire sequence." % request_id


def format_preemption_warning(request_id: str, preemption_mode: object, total_num_cumulative_preemption: int) -> str:
    """`preemption_mode` prints as vLLM's enum does: `PreemptionMode.RECOMPUTE`."""
    return (
        "Sequence group %s is preempted by %s mode because there is not enough KV cache space. "
        "This can affect the end-to-end performance. Increase gpu_memory_utilization or "
        "tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=%d"
        % (request_id, preemption_mode, total_num_cumulative_preemption)
    )


def should_warn_preemption(num_cumulative_preemption_before: int) -> bool:
    """vLLM warns when the count BEFORE this preemption is a multiple of 50."""
    return num_cumulative_preemption_before % PREEMPTION_WARNING_EVERY == 0


def format_engine_stats(
    prompt_throughput: float,
    generation_throughput: float,
    num_running: int,
    num_swapped: int,
    num_waiting: int,
    gpu_cache_usage: float,
    cpu_cache_usage: float,
) -> str:
    """Usages are fractions in [0, 1]; printed as percentages like vLLM."""
    return (
        "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
        "Running: %d reqs, Swapped: %d reqs, Pending: %d reqs, GPU KV cache usage: %.1f%%, "
        "CPU KV cache usage: %.1f%%."
        % (
            prompt_throughput,
            generation_throughput,
            num_running,
            num_swapped,
            num_waiting,
            gpu_cache_usage * 100,
            cpu_cache_usage * 100,
        )
    )


@dataclass
class V0Stats:
    """One step's system state and iteration counts (vLLM's `Stats`, the part the
    v0 line and gauges need)."""

    now: float
    num_running: int
    num_swapped: int
    num_waiting: int
    gpu_cache_usage: float
    cpu_cache_usage: float
    num_prompt_tokens_iter: int = 0
    num_generation_tokens_iter: int = 0
    num_preemption_iter: int = 0


class V0StatLogger:
    """vLLM's `LoggingStatLogger`: token counts are recorded every step, and the
    stats line is logged when more than `local_interval` seconds passed since the
    last line (throughput = tokens recorded since then / elapsed time)."""

    def __init__(
        self, start_time: float, local_interval: float = LOCAL_LOGGING_INTERVAL_SEC, log: logging.Logger | None = None
    ) -> None:
        if local_interval <= 0:
            raise ValueError(f"local_interval={local_interval!r} is invalid; allowed: seconds > 0")
        self.last_local_log = start_time
        self.local_interval = local_interval
        # vLLM keeps per-step lists and sums them at log time; running sums are the same numbers.
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self._logger = log or logger

    def record(self, num_prompt_tokens_iter: int, num_generation_tokens_iter: int) -> None:
        self.num_prompt_tokens += num_prompt_tokens_iter
        self.num_generation_tokens += num_generation_tokens_iter

    def maybe_log(self, stats: V0Stats) -> str | None:
        """Logs and returns the line when the interval has passed, else None."""
        elapsed = stats.now - self.last_local_log
        if not elapsed > self.local_interval:
            return None
        line = format_engine_stats(
            self.num_prompt_tokens / elapsed,
            self.num_generation_tokens / elapsed,
            stats.num_running,
            stats.num_swapped,
            stats.num_waiting,
            stats.gpu_cache_usage,
            stats.cpu_cache_usage,
        )
        self._logger.info(line)
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.last_local_log = stats.now
        return line

    def log(self, stats: V0Stats) -> str | None:
        """vLLM's per-step call: record this step's counts, then maybe log."""
        self.record(stats.num_prompt_tokens_iter, stats.num_generation_tokens_iter)
        return self.maybe_log(stats)
