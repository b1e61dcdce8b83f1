"""One node, two runtimes: the in-process runtime and the Ray runtime run
the same node classes, so where a run's decisions do not depend on timing
they must agree exactly — per request token ids, finish reasons and
preemptions, KV blocks pulled — and a KV outage must cost the same
attempts, retries, failures, done reports and hold timeouts in both.

Timing-independent means: the engine steps one batch at a time (depth 1),
every request arrives at once (one message to the node: no API server in
front, whose per-request time would hand them over one by one, a fraction
of a millisecond apart on the wall clock, so that a step's batch depended
on the wall clock), and the fault policy's decision points lie tens of
milliseconds from each other, far from the wall clock's jitter."""

from __future__ import annotations

import pytest

from bench.wall_twin import to_model_time
from cluster.inproc import run_inproc
from cluster.ray.runtime import run_ray

from .conftest import make_spec as _make_spec
from .conftest import workload

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

KV_KEYS = (
    "kv_pulls_started",
    "kv_pulls_completed",
    "kv_pulls_failed",
    "kv_pull_attempts",
    "transport_retries",
    "kv_blocks_pulled",
    "kv_done_reports_sent",
    "kv_done_reports_delivered",
)
PRODUCER_KEYS = ("kv_done_reports", "kv_failed_done_reports", "kv_late_done_reports", "kv_hold_timeouts")


def make_spec(**overrides):
    return _make_spec(front_end={"preset": "off"}, **overrides)


def per_request(result):
    return {r.request_id: (r.output_token_ids, r.finish_reason, r.num_preemptions) for r in result.requests}


def both(spec, wl, ray_cluster):
    inproc = run_inproc(spec, wl, seed=4)
    ray = run_ray(spec, wl, seed=4, handle=ray_cluster, timeout_s=90)
    assert inproc.invariant_errors == [] and ray.invariant_errors == []
    return inproc, ray


def test_preemptions_tokens_and_finishes_agree_on_an_aggregated_node(ray_cluster):
    # 40 blocks for 10 requests that grow to 8 blocks each: the scheduler
    # preempts, and the order it does so in is fixed by the requests alone.
    spec = make_spec(
        prefill={"count": 0}, time_scale=0.02, decode={"count": 1, "engine": {"num_gpu_blocks": 40, "max_num_seqs": 10}}
    )
    wl = workload(10, 60, 64)
    inproc, ray = both(spec, wl, ray_cluster)
    assert per_request(inproc) == per_request(ray)
    assert sum(r.num_preemptions for r in inproc.requests) > 0
    for key in ("num_preemptions", "num_zero_progress_preemptions", "num_allocate_slots_calls"):
        assert inproc.node_counters["decode-0"][key] == ray.node_counters["decode-0"][key], key


def test_tokens_finishes_and_blocks_pulled_agree_across_the_kv_handoff(ray_cluster):
    spec = make_spec(
        time_scale=0.02, decode={"count": 1, "engine": {"num_gpu_blocks": 1000}}, links={"kv": {"delay_ms": 1.0}}
    )
    wl = workload(12, 70, 24)
    inproc, ray = both(spec, wl, ray_cluster)
    assert per_request(inproc) == per_request(ray)
    assert {k: inproc.node_counters["decode-0"][k] for k in KV_KEYS} == {
        k: ray.node_counters["decode-0"][k] for k in KV_KEYS
    }
    assert inproc.node_counters["decode-0"]["kv_blocks_pulled"] == 12 * 5  # ceil(70 / 16) each
    assert {k: inproc.node_counters["prefill-0"][k] for k in PRODUCER_KEYS} == {
        k: ray.node_counters["prefill-0"][k] for k in PRODUCER_KEYS
    }


def test_a_kv_outage_costs_the_same_retries_timeouts_and_failures_in_both(ray_cluster):
    # The KV link is down for the whole run. Each pull: an attempt times out
    # at 0.3 s, a retry after 0.05 s times out at 0.65 s, the next retry would
    # be due at the 0.7 s deadline: the pull fails (deadline_exceeded), the
    # prompt is recomputed, the failure report is lost, and the producer
    # frees the blocks after its 1.5 s hold timeout.
    spec = make_spec(
        time_scale=0.02,
        decode={"count": 1, "engine": {"num_gpu_blocks": 1000}},
        links={"kv": {"outages": [[0.0, 1000.0]]}},
        kv_pull_timeout_s=0.3,
        kv_pull_deadline_s=0.7,
        kv_pull_backoff_initial_s=0.05,
        kv_pull_backoff_max_s=0.05,
        kv_hold_timeout_s=1.5,
    )
    n = 6
    wl = workload(n, 48, 8)
    inproc, ray = both(spec, wl, ray_cluster)
    assert per_request(inproc) == per_request(ray)
    assert {r.finish_reason for r in inproc.requests} == {"length"}  # recomputed after the failed pull
    decode_in, decode_ray = inproc.node_counters["decode-0"], ray.node_counters["decode-0"]
    expected = {
        "kv_pulls_started": n,
        "kv_pulls_completed": 0,
        "kv_pulls_failed": n,
        "kv_pull_attempts": 2 * n,
        "transport_retries": n,
        "kv_blocks_pulled": 0,
        "kv_done_reports_sent": n,
        "kv_done_reports_delivered": 0,
    }
    assert {k: decode_in[k] for k in KV_KEYS} == expected
    assert {k: decode_ray[k] for k in KV_KEYS} == expected
    assert decode_in["kv_pulls_failed_deadline_exceeded"] == decode_ray["kv_pulls_failed_deadline_exceeded"] == n
    producer = {"kv_done_reports": 0, "kv_failed_done_reports": 0, "kv_late_done_reports": 0, "kv_hold_timeouts": n}
    assert {k: inproc.node_counters["prefill-0"][k] for k in PRODUCER_KEYS} == producer
    assert {k: ray.node_counters["prefill-0"][k] for k in PRODUCER_KEYS} == producer


def test_the_proxy_routes_and_reroutes_alike_in_both_runtimes(ray_cluster):
    # One prefill node finishes every prompt in one step, so its outputs reach
    # the proxy in one batch, in order: least-loaded routing over three decode
    # nodes is then fixed by the requests alone. decode-1 dies while every
    # request decodes (every first token by ~0.23 s of model time, the first
    # finish at ~2.2 s): at 1.0 s of model time in-process; on Ray at 2.0 s of
    # wall time, which is 1.0 s of model time at time_scale 2, with ~1.5 s
    # and ~2.4 s of wall time to either edge (a fault's time is wall seconds,
    # unscaled), room for a loaded machine's late steps and late kill. Its
    # requests move to the least loaded live nodes, their prompts are
    # released at the prefill node, and their streams go on exactly.
    from cluster.inproc import InProcCluster

    spec = make_spec(
        time_scale=2.0,
        prefill={"count": 1, "engine": {"num_gpu_blocks": 2000}},
        decode={"count": 3, "engine": {"num_gpu_blocks": 1000}},
        routing="least_loaded",
    )
    wl = workload(15, 64, 240)
    cluster = InProcCluster(spec, seed=4)
    cluster.submit(wl)
    cluster.kill_node_at("decode-1", 1.0)
    inproc = cluster.run()
    ray = run_ray(spec, wl, seed=4, handle=ray_cluster, faults=[{"kill": "decode-1", "at": 2.0}], timeout_s=90)
    assert per_request(inproc) == per_request(ray)
    assert {r.finish_reason for r in inproc.requests} == {"length"}
    assert inproc.extra["rerouted"] == ray.extra["rerouted"] == {f"r{i:03d}": 1 for i in range(1, 15, 3)}
    assert inproc.extra["failures"] == ray.extra["failures"] == {}
    # Every request once to prefill-0 and to a decode node, decode-1's five twice.
    assert cluster.proxy.routed == ray.extra["routed"] == {"prefill-0": 15, "decode-0": 8, "decode-1": 5, "decode-2": 7}


def test_kv_aware_routing_picks_the_same_nodes_in_both_runtimes(ray_cluster):
    # The same fixed order of outputs as above; the decode pool scores its
    # nodes (queue depth and the prompt blocks outstanding, 2:1 as weighted
    # here), the prefill pool keeps round robin: the same choices on Ray.
    from cluster.inproc import InProcCluster

    spec = make_spec(
        time_scale=1.0,
        prefill={"count": 1, "engine": {"num_gpu_blocks": 2000}},
        decode={"count": 3, "engine": {"num_gpu_blocks": 1000}, "routing": "kv_aware"},
        routing_weights={"prefix": 3.0, "queue": 2.0, "kv_usage": 1.0},
    )
    wl = workload(12, 64, 120)
    cluster = InProcCluster(spec, seed=4)
    cluster.submit(wl)
    inproc = cluster.run()
    ray = run_ray(spec, wl, seed=4, handle=ray_cluster, timeout_s=90)
    assert inproc.invariant_errors == [] and ray.invariant_errors == []
    assert per_request(inproc) == per_request(ray)
    assert cluster.proxy.routed == ray.extra["routed"] == {"prefill-0": 12, "decode-0": 4, "decode-1": 4, "decode-2": 4}


def test_the_pd_timeline_runs_in_both_and_its_parts_add_up(ray_cluster):
    # NIXL-like hand-off (handshake shortened so the run stays short): the
    # proxy's HTTP legs are timers, the connector's terms sleeps on Ray.
    # Wall time only adds to the modelled terms (a cold Ray run's first steps
    # cost tens of milliseconds more on a loaded machine), so Ray's TTFTs are
    # not compared with the virtual clock's; their parts are.
    spec = make_spec(
        time_scale=1.0,
        decode={"count": 1, "engine": {"num_gpu_blocks": 1000}},
        kv_transfer={"preset": "nixl", "handshake_s": 0.3},
    )
    wl = workload(6, 200, 8, gap_s=0.05)
    inproc, wall = both(spec, wl, ray_cluster)
    ray = to_model_time(wall)  # as `disagg-sim run` reports a Ray run
    assert per_request(inproc) == per_request(ray)
    for run, tol_s in ((inproc, 1e-9), (ray, 1e-6)):
        for r in run.requests:
            parts = r.ttft_breakdown
            assert parts is not None and abs(sum(parts.values()) - r.ttft) <= tol_s, (r.request_id, parts, r.ttft)
            # The proxy's legs are its own timers: exact on both clocks.
            assert parts["proxy_prefill_request"] == pytest.approx(0.002, abs=1e-6)
            assert parts["proxy_decode_request"] == pytest.approx(0.004, abs=1e-6)
    # Whatever the wall clock adds, a modelled term is never shortened.
    modelled = 0.3 + 0.001 + 0.001  # handshake, metadata, transfer latency
    for run in (inproc, ray):
        first = min(run.requests, key=lambda r: r.arrival_time)
        assert first.ttft_breakdown["transfer"] >= modelled, _ms(first)


def _ms(r) -> str:
    return " ".join(f"{k}={v * 1000:.1f}" for k, v in (r.ttft_breakdown or {}).items() if v)
