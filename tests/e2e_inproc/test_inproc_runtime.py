"""End-to-end runs of the in-process (virtual clock) runtime."""

import pytest

from bench.metrics import compute_metrics
from cluster.inproc import InProcCluster, run_inproc
from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest


def cascade_spec(guard="fixed", fence="auto", blocks=300, kv_delay_ms=1.0, **links):
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": 1, "engine": {"num_gpu_blocks": 2000}},
            "decode": {
                "count": 1,
                "engine": {
                    "num_gpu_blocks": blocks,
                    "max_num_seqs": 64,
                    "async_scheduling": True,
                    "preemption_guard": guard,
                    "fence": fence,
                },
            },
            "links": {"kv": {"delay_ms": kv_delay_ms, **links}},
            "cost_model": "synthetic-8b",
        }
    )


def burst(n=40, prompt=128, out=224, at=0.0):
    return [WorkloadRequest(f"r{i:03d}", at, prompt, out) for i in range(n)]


def test_a_request_flows_prefill_pull_decode():
    spec = cascade_spec(blocks=100)
    cluster = InProcCluster(spec, seed=0, trace=True)
    cluster.submit([WorkloadRequest("only", 0.0, 100, 20)])
    result = cluster.run()
    assert result.invariant_errors == []
    (rec,) = result.requests
    assert rec.finish_reason == "length" and len(rec.output_token_ids) == 20
    events = [e[1] for e in result.trace]
    assert events == ["arrive", "to_decode", "pull_start", "pull_end", "finish"]
    assert rec.remote_kv_wait_start is not None and rec.remote_kv_wait_end > rec.remote_kv_wait_start
    prefill = cluster.nodes["prefill-0"].core.scheduler
    assert not prefill.requests  # freed after finished_sending
    assert result.extra["kv_pulls"]["completed"] == 1


def test_same_seed_same_trace_bit_for_bit():
    def once():
        c = InProcCluster(cascade_spec(guard="prefix"), seed=3, trace=True)
        c.submit(burst(30))
        r = c.run()
        return (
            r.trace,
            [(x.request_id, x.token_times, x.output_token_ids) for x in r.requests],
            [s.to_dict() for s in r.steps],
        )

    assert once() == once()


def test_different_seeds_differ():
    a = run_inproc(cascade_spec(kv_delay_ms=1.0, jitter_ms=0.5), burst(10), seed=1)
    b = run_inproc(cascade_spec(kv_delay_ms=1.0, jitter_ms=0.5), burst(10), seed=2)
    assert [r.token_times for r in a.requests] != [r.token_times for r in b.requests]


def test_cascade_prefix_guard_vs_fix():
    prefix = run_inproc(cascade_spec("prefix"), burst(), seed=0)
    fixed = run_inproc(cascade_spec("fixed"), burst(), seed=0)
    p, f = prefix.counters_for("decode"), fixed.counters_for("decode")
    assert prefix.invariant_errors == [] and fixed.invariant_errors == []
    assert p["num_zero_progress_preemptions"] > 0
    assert f["num_zero_progress_preemptions"] == 0
    assert f["num_preemptions"] > 0
    assert p["num_preemptions"] >= 5 * f["num_preemptions"]
    assert p["kv_corruptions_detected"] == f["kv_corruptions_detected"] == 0


def test_fence_off_shows_corruption_fence_on_none():
    on = run_inproc(cascade_spec("fixed", fence="auto"), burst(), seed=0)
    off = run_inproc(cascade_spec("fixed", fence="off"), burst(), seed=0)
    assert on.counters()["kv_corruptions_detected"] == 0
    assert off.counters()["kv_corruptions_detected"] > 0
    assert any(v["kind"] == "stale_write" for v in off.violations)


def test_debug_mode_checks_every_step():
    cluster = InProcCluster(cascade_spec("prefix"), seed=0, debug_invariants=True)
    cluster.submit(burst(20))
    assert cluster.run().invariant_errors == []


def test_kv_delay_raises_ttft_by_about_the_delay():
    wl = [WorkloadRequest(f"r{i}", i * 1.0, 64, 4) for i in range(10)]  # one at a time
    base = compute_metrics(run_inproc(cascade_spec(blocks=200, kv_delay_ms=0.0), wl).requests)
    slow = compute_metrics(run_inproc(cascade_spec(blocks=200, kv_delay_ms=50.0), wl).requests)
    # A pull is a request (one way) plus the payload (back): two link delays.
    assert slow.latencies["ttft"].median_ms - base.latencies["ttft"].median_ms == pytest.approx(100.0, abs=2.0)


def test_killed_prefill_node_fails_its_requests_and_nothing_hangs():
    spec = ClusterSpec.model_validate(
        {
            "prefill": {"count": 2},
            "decode": {"count": 1, "engine": {"async_scheduling": True}},
            "kv_pull_deadline_s": 1.0,
        }
    )
    cluster = InProcCluster(spec, seed=0)
    cluster.submit([WorkloadRequest(f"r{i}", i * 0.01, 256, 50) for i in range(40)])
    cluster.kill_node_at("prefill-1", 0.15)
    result = cluster.run()
    reasons = {r.finish_reason for r in result.requests}
    assert reasons <= {"length", "stop", "error"} and "error" in reasons and "length" in reasons
    assert len(result.requests) == 40
    assert result.invariant_errors == []
    # After the kill the proxy routes every new request to the surviving node.
    late = [r for r in result.requests if r.arrival_time > 0.2]
    assert late and all(r.finish_reason == "length" for r in late)


def test_lossy_kv_link_retries_and_finishes():
    spec = cascade_spec(blocks=400, kv_delay_ms=1.0, loss=0.3)
    spec.kv_pull_timeout_s = 0.05
    result = run_inproc(spec, burst(20, out=20), seed=5)
    assert result.invariant_errors == []
    assert all(r.finish_reason == "length" for r in result.requests)
    assert result.extra["kv_pulls"]["retries"] > 0


def test_kv_outage_window_is_survived():
    spec = cascade_spec(blocks=400, outages=[(0.0, 0.5)])
    spec.kv_pull_timeout_s = 0.1
    result = run_inproc(spec, burst(10, out=10), seed=0)
    assert result.invariant_errors == []
    assert all(r.finish_reason == "length" for r in result.requests)
    assert min(r.ttft for r in result.requests) > 0.5


def test_closed_loop_caps_concurrency():
    result = run_inproc(cascade_spec(blocks=400), burst(30, out=16), seed=0, max_concurrency=4)
    m = compute_metrics(result.requests)
    assert m.max_concurrent_requests <= 4
    assert result.invariant_errors == []


def test_aggregated_topology_without_prefill_nodes():
    spec = ClusterSpec.model_validate({"prefill": {"count": 0}, "decode": {"count": 2, "pp_size": 2}})
    result = run_inproc(spec, burst(16, out=32), seed=0)
    assert result.invariant_errors == []
    assert all(len(r.output_token_ids) == 32 for r in result.requests)


def test_pipeline_parallel_decode_keeps_pp_batches_in_flight():
    spec = ClusterSpec.model_validate({"prefill": {"count": 1}, "decode": {"count": 1, "pp_size": 4}})
    result = run_inproc(spec, burst(32, out=32), seed=0)
    assert max(s.batches_in_flight for s in result.steps if s.node == "decode-0") == 4
    assert result.invariant_errors == []


def test_stop_tokens_end_requests_early_unless_ignore_eos():
    def run(ignore_eos):
        spec = ClusterSpec.model_validate(
            {
                "prefill": {"count": 1},
                "decode": {"count": 1},
                "sampler": {"stop_probability": 0.01, "ignore_eos": ignore_eos},
            }
        )
        return run_inproc(spec, burst(20, out=100), seed=0)

    stopping, ignoring = run(False), run(True)
    assert stopping.invariant_errors == [] and ignoring.invariant_errors == []
    assert {r.finish_reason for r in stopping.requests} == {"stop", "length"}
    assert {r.finish_reason for r in ignoring.requests} == {"length"}
    assert all(len(r.output_token_ids) == 100 for r in ignoring.requests)
