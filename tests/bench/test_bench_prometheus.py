"""The per-node exporter, scraped over HTTP on 127.0.0.1."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.prometheus import TIME_TO_FIRST_TOKEN_BUCKETS, NodeMetricsExporter
from engine.records import RequestRecord, StepRecord

VLLM_NAMES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:num_requests_swapped",
    "vllm:gpu_cache_usage_perc",
    "vllm:cpu_cache_usage_perc",
]
SIM_NAMES = [
    "disagg_sim:num_zero_progress_preemptions_total",
    "disagg_sim:deferred_free_blocks",
    "disagg_sim:deferred_free_blocks_peak",
    "disagg_sim:num_allocate_slots_calls_total",
    "disagg_sim:kv_corruptions_detected_total",
    "disagg_sim:num_blocks_freed_by_drain_total",
]


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text, name, **extra):
    labels = {"model_name": "m", "engine": "decode-0", **extra}
    return samples(text)[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def exporter():
    e = NodeMetricsExporter("decode-0", model_name="m")
    yield e
    e.stop()


def test_scrape_over_http_has_vllm_and_sim_names(exporter):
    port = exporter.start(port=0)
    assert port > 0 and exporter.url == f"http://127.0.0.1:{port}/metrics"
    exporter.update_gauges(num_running=3, num_waiting=2, kv_cache_usage=0.75, num_deferred_blocks=4)
    exporter.sync_counters({"num_preemptions": 2, "num_zero_progress_preemptions": 1, "num_allocate_slots_calls": 10})
    exporter.observe_request(
        RequestRecord(
            "a",
            0.0,
            8,
            3,
            first_scheduled_time=0.2,
            token_times=[0.3, 0.35, 0.5],
            finish_time=0.5,
            finish_reason="length",
        )
    )
    with urllib.request.urlopen(exporter.url, timeout=10) as resp:
        text = resp.read().decode()
    for name in VLLM_NAMES + SIM_NAMES:
        assert f"\n{name}{{" in text, name
    assert value(text, "vllm:num_requests_running") == 3
    assert value(text, "vllm:kv_cache_usage_perc") == 0.75
    assert value(text, "vllm:gpu_cache_usage_perc") == 0.75
    assert value(text, "vllm:num_preemptions_total") == 2
    assert value(text, "disagg_sim:num_zero_progress_preemptions_total") == 1
    assert value(text, "disagg_sim:num_allocate_slots_calls_total") == 10
    assert value(text, "disagg_sim:deferred_free_blocks_peak") == 4
    # ttft 0.3 s falls in the 0.5 bucket but not the 0.25 one; two ITL gaps observed.
    assert value(text, "vllm:time_to_first_token_seconds_bucket", le="0.25") == 0
    assert value(text, "vllm:time_to_first_token_seconds_bucket", le="0.5") == 1
    assert value(text, "vllm:inter_token_latency_seconds_count") == 2
    assert value(text, "vllm:request_queue_time_seconds_sum") == pytest.approx(0.2)


def test_buckets_are_vllms(exporter):
    exporter.observe_request(RequestRecord("a", 0.0, 8, 1, token_times=[0.1], finish_time=0.1, finish_reason="stop"))
    les = [k[1] for k in samples(exporter.render().decode()) if k[0] == "vllm:time_to_first_token_seconds_bucket"]
    bounds = sorted(float(dict(lbl)["le"]) for lbl in les)
    assert bounds == sorted([*TIME_TO_FIRST_TOKEN_BUCKETS, float("inf")])
    assert TIME_TO_FIRST_TOKEN_BUCKETS[-1] == 2560.0 and len(TIME_TO_FIRST_TOKEN_BUCKETS) == 22


def test_sync_counters_and_observe_step(exporter):
    exporter.sync_counters({"num_preemptions": 5, "kv_corruptions_detected": 1, "deferred_free_blocks_peak": 9})
    exporter.sync_counters({"num_preemptions": 7, "kv_corruptions_detected": 1})
    step = StepRecord(
        node="decode-0",
        time=1.0,
        step_index=3,
        batch_size=2,
        num_scheduled_tokens=2,
        num_prefill_tokens=0,
        num_decode_tokens=2,
        num_running=2,
        num_waiting=5,
        num_waiting_for_remote_kvs=1,
        num_free_blocks=2,
        num_deferred_blocks=3,
        num_total_blocks=8,
        batches_in_flight=2,
        num_preemptions_total=8,
        num_zero_progress_preemptions_total=4,
    )
    exporter.observe_step(step)
    text = exporter.render().decode()
    assert value(text, "vllm:num_preemptions_total") == 8
    assert value(text, "disagg_sim:num_zero_progress_preemptions_total") == 4
    assert value(text, "disagg_sim:kv_corruptions_detected_total") == 1
    assert value(text, "disagg_sim:deferred_free_blocks_peak") == 9
    assert value(text, "vllm:num_requests_waiting") == 5
    assert value(text, "vllm:kv_cache_usage_perc") == 0.75
    with pytest.raises(ValueError, match="counter num_preemptions went backwards: 8 -> 3"):
        exporter.sync_counters({"num_preemptions": 3})


def test_two_nodes_in_one_process_do_not_collide():
    a, b = NodeMetricsExporter("prefill-0"), NodeMetricsExporter("decode-0")
    a.sync_counters({"num_preemptions": 1})
    assert 'engine="prefill-0"' in a.render().decode()
    assert "vllm:num_preemptions_total{" in b.render().decode()
    assert 'engine="prefill-0"' not in b.render().decode()


def test_prefix_cache_counters_use_vllm_names():
    e = NodeMetricsExporter("decode-0", model_name="m")
    e.sync_counters({"prefix_cache_queries": 640, "prefix_cache_hits": 512})
    text = e.render().decode()
    assert value(text, "vllm:prefix_cache_queries_total") == 640
    assert value(text, "vllm:prefix_cache_hits_total") == 512


def test_the_ttft_breakdown_is_a_histogram_per_part():
    from bench.prometheus import NodeMetricsExporter
    from engine.records import RequestRecord
    from proxy.breakdown import PARTS

    exp = NodeMetricsExporter("decode-0")
    rec = RequestRecord("r", 0.0, 10, 2, token_times=[0.25, 0.3], finish_time=0.3, finish_reason="length")
    rec.ttft_breakdown = dict.fromkeys(PARTS, 0.0) | {"prefill": 0.2, "transfer": 0.05}
    exp.observe_request(rec)
    text = exp.render().decode()
    for part in PARTS:
        assert f"disagg_sim:ttft_{part}_seconds_count" in text
    assert 'disagg_sim:ttft_prefill_seconds_sum{engine="decode-0",model_name="disagg-sim"} 0.2' in text
    assert 'disagg_sim:ttft_transfer_seconds_sum{engine="decode-0",model_name="disagg-sim"} 0.05' in text
