"""vLLM 0.5.3.post1's v0 log lines, word for word, and the 5 s stats logger."""

import logging

import pytest

from engine.v0 import CacheConfig, Scheduler, SchedulerConfig
from engine.v0.loglines import (
    V0StatLogger,
    V0Stats,
    format_chunked_prefill_enabled,
    format_engine_stats,
    format_num_blocks,
    format_prompt_exceeds_capacity,
    format_prompt_too_long,
    format_swap_in_infeasible,
    should_warn_preemption,
)


def test_formatters_reproduce_vllm_text():
    assert format_num_blocks(7281, 2048) == "# GPU blocks: 7281, # CPU blocks: 2048"
    assert format_prompt_too_long(5000, 4096) == "Input prompt (5000 tokens) is too long and exceeds limit of 4096"
    assert (
        format_prompt_exceeds_capacity(70)
        == "Input prompt (70 tokens) is too long and exceeds the capacity of block_manager"
    )
    assert format_swap_in_infeasible("r9") == (
        "Failing the request r9 because there's not enough kv cache blocks to run the entire sequence."
    )
    assert format_chunked_prefill_enabled(512) == "Chunked prefill is enabled with max_num_batched_tokens=512."
    assert format_engine_stats(1234.56, 78.04, 3, 2, 41, 0.9876, 0.0) == (
        "Avg prompt throughput: 1234.6 tokens/s, Avg generation throughput: 78.0 tokens/s, Running: 3 reqs, "
        "Swapped: 2 reqs, Pending: 41 reqs, GPU KV cache usage: 98.8%, CPU KV cache usage: 0.0%."
    )


@pytest.mark.parametrize("before,warn", [(0, True), (1, False), (49, False), (50, True), (100, True), (101, False)])
def test_preemption_warning_cadence(before, warn):
    assert should_warn_preemption(before) is warn


def test_chunked_prefill_notice_is_logged_under_vllm_v0(caplog):
    caplog.set_level(logging.INFO, logger="vllm.v0")
    Scheduler(SchedulerConfig(enable_chunked_prefill=True), CacheConfig(num_gpu_blocks=8))
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("vllm.v0", "INFO", "Chunked prefill is enabled with max_num_batched_tokens=512.")
    ]


def test_stat_logger_logs_only_after_more_than_the_interval(caplog):
    caplog.set_level(logging.INFO, logger="vllm.v0")
    sl = V0StatLogger(start_time=0.0)
    stats = dict(num_running=1, num_swapped=0, num_waiting=2, gpu_cache_usage=0.5, cpu_cache_usage=0.25)
    assert sl.log(V0Stats(now=2.0, num_prompt_tokens_iter=100, **stats)) is None
    assert sl.log(V0Stats(now=5.0, num_generation_tokens_iter=10, **stats)) is None  # exactly 5 s: not yet
    line = sl.log(V0Stats(now=8.0, num_generation_tokens_iter=6, **stats))
    assert line == (
        "Avg prompt throughput: 12.5 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, "
        "Swapped: 0 reqs, Pending: 2 reqs, GPU KV cache usage: 50.0%, CPU KV cache usage: 25.0%."
    )
    assert [r.getMessage() for r in caplog.records] == [line]
    # Counts restart after a line.
    assert sl.log(V0Stats(now=14.0, num_prompt_tokens_iter=60, **stats)).startswith(
        "Avg prompt throughput: 10.0 tokens/s"
    )
    with pytest.raises(ValueError, match="local_interval=0 is invalid"):
        V0StatLogger(0.0, local_interval=0)
