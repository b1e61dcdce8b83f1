"""Metric arithmetic against hand-computed numbers."""

import pytest

from bench.metrics import compute_metrics, latency_stats, max_overlap, percentile_word, step_aggregates
from engine.records import RequestRecord, StepRecord

EXACT = dict(rel=1e-12, abs=1e-9)


def hand_records() -> list[RequestRecord]:
    return [
        # ttft 1.0, e2el 2.5, itls 0.5 and 1.0, tpot (2.5 - 1.0) / 2 = 0.75, queue 0.5
        RequestRecord(
            "r1",
            arrival_time=0.0,
            prompt_len=10,
            max_tokens=3,
            first_scheduled_time=0.5,
            token_times=[1.0, 1.5, 2.5],
            finish_time=2.5,
            finish_reason="length",
        ),
        # one token: ttft 0.2, e2el 0.2, no tpot, no itl; queue 0.1, remote KV wait 0.1
        RequestRecord(
            "r2",
            arrival_time=1.0,
            prompt_len=20,
            max_tokens=8,
            first_scheduled_time=1.1,
            remote_kv_wait_start=1.05,
            remote_kv_wait_end=1.15,
            token_times=[1.2],
            finish_time=1.2,
            finish_reason="stop",
        ),
        # aborted: failed, contributes no tokens, but its finish bounds the run
        RequestRecord(
            "r3",
            arrival_time=2.0,
            prompt_len=40,
            max_tokens=8,
            token_times=[2.5],
            finish_time=3.0,
            finish_reason="abort",
        ),
        # never finished: failed and unfinished
        RequestRecord("r4", arrival_time=0.5, prompt_len=80, max_tokens=8),
    ]


def test_counts_tokens_and_throughput():
    m = compute_metrics(hand_records())
    assert (m.num_requests, m.completed, m.failed, m.num_unfinished) == (4, 2, 2, 1)
    assert (m.total_input_tokens, m.total_output_tokens) == (30, 4)
    assert m.duration == 3.0  # first arrival 0.0 to last finish 3.0
    assert m.request_throughput == pytest.approx(2 / 3, **EXACT)
    assert m.output_throughput == pytest.approx(4 / 3, **EXACT)
    assert m.total_token_throughput == pytest.approx(34 / 3, **EXACT)
    assert m.max_concurrent_requests == 2
    assert m.max_output_tokens_per_s == 3.0  # second [1, 2) holds tokens at 1.0, 1.5 and 1.2


def test_latency_statistics_in_ms():
    d = compute_metrics(hand_records()).to_dict()
    expected = {
        # TTFT [1.0, 0.2]
        "mean_ttft_ms": 600.0,
        "median_ttft_ms": 600.0,
        "std_ttft_ms": 400.0,
        "p50_ttft_ms": 600.0,
        "p90_ttft_ms": 920.0,
        "p99_ttft_ms": 992.0,
        # TPOT [0.75] (r2 has a single token and is left out)
        "mean_tpot_ms": 750.0,
        "median_tpot_ms": 750.0,
        "std_tpot_ms": 0.0,
        "p99_tpot_ms": 750.0,
        # ITL [0.5, 1.0]
        "mean_itl_ms": 750.0,
        "median_itl_ms": 750.0,
        "std_itl_ms": 250.0,
        "p90_itl_ms": 950.0,
        "p99_itl_ms": 995.0,
        # E2EL [2.5, 0.2]
        "mean_e2el_ms": 1350.0,
        "median_e2el_ms": 1350.0,
        "std_e2el_ms": 1150.0,
        "p90_e2el_ms": 2270.0,
        "p99_e2el_ms": 2477.0,
        # queue [0.5, 0.1], remote KV wait [0.1]
        "mean_queue_time_ms": 300.0,
        "p50_queue_time_ms": 300.0,
        "mean_remote_kv_wait_ms": 100.0,
        "std_remote_kv_wait_ms": 0.0,
    }
    for key, value in expected.items():
        assert d[key] == pytest.approx(value, **EXACT), key


def test_explicit_duration_and_custom_percentiles():
    m = compute_metrics(hand_records(), duration=4.0, percentiles=[25, 99.9])
    d = m.to_dict()
    assert m.request_throughput == 0.5
    assert d["p25_ttft_ms"] == pytest.approx(400.0, **EXACT)
    assert d["p99.9_ttft_ms"] == pytest.approx(999.2, **EXACT)
    assert "p99_ttft_ms" not in d


def test_empty_run_reports_zeros_like_vllm():
    d = compute_metrics([]).to_dict()
    assert d["completed"] == 0 and d["duration"] == 0.0 and d["request_throughput"] == 0.0
    assert d["mean_ttft_ms"] == 0.0 and d["p99_e2el_ms"] == 0.0


def test_bad_percentile_and_duration_rejected():
    with pytest.raises(ValueError, match="percentile 101"):
        compute_metrics(hand_records(), percentiles=[101])
    with pytest.raises(ValueError, match="duration"):
        compute_metrics(hand_records(), duration=-1.0)


def test_percentile_word_matches_vllm_spelling():
    assert [percentile_word(p) for p in (50, 99.0, 99.9)] == ["50", "99", "99.9"]


def test_latency_stats_population_std():
    s = latency_stats([0.001, 0.002, 0.003, 0.004], [50])
    assert s.mean_ms == pytest.approx(2.5, **EXACT)
    assert s.std_ms == pytest.approx(1.118033988749895, **EXACT)


def test_max_overlap_is_half_open():
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1
    assert max_overlap([(0, 3), (1, 2), (1.5, 4), (3, 5)]) == 3
    assert max_overlap([]) == 0


def step(node, t, free, total=10, running=1, waiting=0, deferred=0, inflight=1, pre=0, zp=0):
    return StepRecord(
        node=node,
        time=t,
        step_index=int(t),
        batch_size=running,
        num_scheduled_tokens=running,
        num_prefill_tokens=0,
        num_decode_tokens=running,
        num_running=running,
        num_waiting=waiting,
        num_waiting_for_remote_kvs=0,
        num_free_blocks=free,
        num_deferred_blocks=deferred,
        num_total_blocks=total,
        batches_in_flight=inflight,
        num_preemptions_total=pre,
        num_zero_progress_preemptions_total=zp,
        duration=0.01,
    )


def test_step_aggregates_overall_and_per_node():
    steps = [
        step("d0", 0, free=10, running=2, waiting=3),
        step("d0", 1, free=5, running=4, deferred=2, inflight=2),
        step("p0", 0, free=2, running=1),
    ]
    agg = step_aggregates(steps)
    assert agg["num_steps"] == 3
    assert agg["mean_kv_usage"] == pytest.approx((0.0 + 0.5 + 0.8) / 3, **EXACT)
    assert agg["max_kv_usage"] == pytest.approx(0.8, **EXACT)
    assert agg["max_num_running"] == 4 and agg["max_num_waiting"] == 3
    assert agg["max_num_deferred_blocks"] == 2 and agg["max_batches_in_flight"] == 2
    assert agg["total_decode_tokens"] == 7
    assert agg["per_node"]["d0"]["mean_kv_usage"] == pytest.approx(0.25, **EXACT)
    assert agg["per_node"]["p0"]["num_steps"] == 1
    assert step_aggregates([]) == {"num_steps": 0, "per_node": {}}


def test_one_node_aggregates_equal_the_overall_ones():
    steps = [step("d0", 0, free=10, running=2, waiting=3), step("d0", 1, free=5, running=4, deferred=2, inflight=2)]
    agg = step_aggregates(steps)
    per_node = agg.pop("per_node")
    assert per_node == {"d0": agg}


def test_peak_output_rate_counts_tokens_in_whole_seconds_from_the_first_arrival():
    # Buckets from t0 = 0.5 (the first arrival): [0.5, 1.5) holds 1.0 and 1.4 and 1.2,
    # [1.5, 2.5) holds 1.5 and 2.4, [2.5, 3.5) holds 2.5.
    recs = [
        RequestRecord("a", 0.5, 1, 3, token_times=[1.0, 1.4, 2.4], finish_time=2.4, finish_reason="length"),
        RequestRecord("b", 1.0, 1, 3, token_times=[1.2, 1.5, 2.5], finish_time=2.5, finish_reason="length"),
    ]
    assert compute_metrics(recs).max_output_tokens_per_s == 3.0
    assert compute_metrics(recs[1:]).max_output_tokens_per_s == 2.0  # t0 = 1.0: [1.0, 2.0) holds 1.2 and 1.5


def test_step_record_dict_is_every_field_plus_kv_usage():
    import dataclasses

    s = step("d0", 3, free=4, running=2, waiting=1, deferred=1, inflight=2)
    d = s.to_dict()
    assert list(d) == [f.name for f in dataclasses.fields(StepRecord)] + ["kv_usage"]
    assert d == {**dataclasses.asdict(s), "kv_usage": s.kv_usage}


def test_goodput_counts_completed_requests_meeting_every_slo_target():
    # r1: ttft 1.0, tpot 0.75, e2el 2.5; r2: ttft 0.2, one token (tpot 0), e2el 0.2; r3, r4 never good.
    records = hand_records()
    both = compute_metrics(records, duration=4.0, slo={"ttft": 1.0, "tpot": 0.75}).to_dict()
    assert both["request_goodput"] == 2 / 4.0 and both["slo_attainment_pct"] == 50.0
    tight = compute_metrics(records, duration=4.0, slo={"ttft": 0.5, "tpot": 0.75}).to_dict()
    assert tight["request_goodput"] == 1 / 4.0  # only r2's TTFT is within 0.5 s
    e2el = compute_metrics(records, duration=4.0, slo={"e2el": 2.0}).to_dict()
    assert e2el["request_goodput"] == 1 / 4.0
    # Without targets, no goodput keys (results of scenarios without `report.slo` are unchanged).
    assert "request_goodput" not in compute_metrics(records, duration=4.0).to_dict()
