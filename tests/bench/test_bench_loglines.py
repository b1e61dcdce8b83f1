"""vLLM-style log lines and the periodic logger driven by a caller's clock."""

import logging

from bench.loglines import PeriodicStatLogger, format_v1_line
from engine.records import StepRecord
from engine.v0.loglines import format_engine_stats


def test_v1_line_exact_wording():
    line = format_v1_line(
        engine_index=0,
        prompt_throughput=1234.56,
        generation_throughput=78.9,
        num_running=5,
        num_waiting=2,
        kv_cache_usage=0.4567,
    )
    assert line == (
        "Engine 000: Avg prompt throughput: 1234.6 tokens/s, Avg generation throughput: 78.9 tokens/s, "
        "Running: 5 reqs, Waiting: 2 reqs, GPU KV cache usage: 45.7%"
    )


def test_v1_optional_parts_in_vllm_order():
    line = format_v1_line(
        engine_index=12,
        prompt_throughput=0,
        generation_throughput=0,
        num_running=0,
        num_waiting=0,
        kv_cache_usage=1.0,
        num_deferred=3,
        num_preemptions=4,
        prefix_cache_hit_rate=0.125,
    )
    assert line == (
        "Engine 012: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, "
        "Running: 0 reqs, Waiting: 0 reqs, Deferred: 3 reqs, Preemptions: 4, "
        "GPU KV cache usage: 100.0%, Prefix cache hit rate: 12.5%"
    )


def test_v0_line_exact_wording():
    # A v0 node's lines come from the v0 engine itself.
    assert format_engine_stats(10, 20.04, 1, 2, 3, 0.5, 0.25) == (
        "Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 20.0 tokens/s, Running: 1 reqs, "
        "Swapped: 2 reqs, Pending: 3 reqs, GPU KV cache usage: 50.0%, CPU KV cache usage: 25.0%."
    )


def test_periodic_logger_averages_over_interval(caplog):
    log = PeriodicStatLogger(engine_index=1, interval=5.0, node_name="decode-0")
    with caplog.at_level(logging.DEBUG, logger="disagg_sim.stats"):
        assert log.record(1.0, num_prompt_tokens=100, num_running=1, num_waiting=3, kv_cache_usage=0.1) is None
        assert (
            log.record(
                4.0, num_generation_tokens=50, num_preemptions=2, num_running=2, num_waiting=1, kv_cache_usage=0.2
            )
            is None
        )
        line = log.record(5.0, num_generation_tokens=50, num_running=3, num_waiting=0, kv_cache_usage=0.3)
        # 100 prompt and 100 generation tokens over 5 s; gauges from the latest step.
        assert line == (
            "Engine 001: Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 20.0 tokens/s, "
            "Running: 3 reqs, Waiting: 0 reqs, Preemptions: 2, GPU KV cache usage: 30.0%"
        )
        # Counters reset: the next window is idle after one busy one, so still INFO; then DEBUG.
        second = log.record(10.0, num_running=0, num_waiting=0, kv_cache_usage=0.0)
        third = log.record(15.0, num_running=0, num_waiting=0, kv_cache_usage=0.0)
    assert "Avg prompt throughput: 0.0 tokens/s" in second and "Preemptions" not in second
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO, logging.DEBUG]
    assert caplog.records[0].getMessage() == "[decode-0] " + line
    assert log.lines == [line, second, third]


def test_record_step_uses_step_fields():
    log = PeriodicStatLogger(interval=1.0, log=None)
    mk = lambda t, pre: StepRecord(
        node="d",
        time=t,
        step_index=int(t * 10),
        batch_size=2,
        num_scheduled_tokens=12,
        num_prefill_tokens=10,
        num_decode_tokens=2,
        num_running=2,
        num_waiting=1,
        num_waiting_for_remote_kvs=1,
        num_free_blocks=3,
        num_deferred_blocks=0,
        num_total_blocks=4,
        batches_in_flight=1,
        num_preemptions_total=pre,
        num_zero_progress_preemptions_total=0,
    )
    assert log.record_step(mk(0.5, 1)) is None
    line = log.record_step(mk(1.0, 3))
    assert line == (
        "Engine 000: Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 4.0 tokens/s, "
        "Running: 2 reqs, Waiting: 2 reqs, Preemptions: 3, GPU KV cache usage: 25.0%"
    )
