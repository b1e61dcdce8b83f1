"""Faults across processes: a KV link outage and a killed prefill node are
survived — every request finishes, or fails with a clear status; none is
lost or stuck, and the surviving nodes end with their pools free.

A pull lost to the outage is retried (per-attempt timeout) until its
deadline; past it the decode node follows vLLM's load-failure handling:
recompute the prompt itself (the default) or finish the request with
FINISHED_ERROR ("fail")."""

import collections

import pytest

from cluster.ray.runtime import run_ray

from .conftest import make_spec, workload

pytestmark = [pytest.mark.ray, pytest.mark.timeout(150)]

OUTAGE = (0.3, 1.3)


def outage_spec(policy: str):
    return make_spec(
        decode={
            "count": 1,
            "engine": {"num_gpu_blocks": 1000, "async_scheduling": True, "kv_load_failure_policy": policy},
        },
        links={"kv": {"delay_ms": 1.0, "outages": [OUTAGE]}},
        kv_pull_timeout_s=0.2,
        kv_pull_deadline_s=0.6,
    )


# Arrivals every 60 ms over 1.8 s: pulls before, early in (they hit their
# deadline), late in (they succeed once the link is back) and after the outage.
OUTAGE_WORKLOAD = workload(30, 64, 16, gap_s=0.06)


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_kv_link_outage_is_survived_by_retrying_then_the_load_failure_policy(ray_cluster, policy):
    # Failure reports sent during the outage are lost: the producer frees
    # those blocks after its hold timeout (1.5 s here), as vLLM's would.
    result = run_ray(
        outage_spec(policy), OUTAGE_WORKLOAD, seed=0, handle=ray_cluster, timeout_s=60, kv_hold_timeout_s=1.5
    )
    decode = result.node_counters["decode-0"]
    reasons = collections.Counter(r.finish_reason for r in result.requests)

    assert result.invariant_errors == []  # all terminal, tokens right, pools free on both nodes
    assert len(result.requests) == len(OUTAGE_WORKLOAD)
    assert decode["kv_pulls_failed"] > 0  # started in the outage, out of time before it ended
    assert decode["kv_pulls_failed"] == decode.get("kv_pulls_failed_deadline_exceeded", 0)
    assert decode["transport_retries"] > 0
    assert decode["kv_pulls_completed"] + decode["kv_pulls_failed"] == len(OUTAGE_WORKLOAD)
    retried_then_landed = [
        r
        for r in result.requests
        if r.remote_kv_wait_end is not None
        and r.remote_kv_wait_start < OUTAGE[1] < r.remote_kv_wait_end
        and r.finish_reason == "length"
    ]
    assert retried_then_landed, "no pull was retried through the outage"
    if policy == "recompute":
        assert reasons == {"length": len(OUTAGE_WORKLOAD)}
    else:
        assert reasons == {"length": decode["kv_pulls_completed"], "error": decode["kv_pulls_failed"]}
        assert all(not r.output_token_ids for r in result.requests if r.finish_reason == "error")
    assert result.node_counters["prefill-0"]["kv_hold_timeouts"] <= decode["kv_pulls_failed"]
    assert result.counters()["kv_corruptions_detected"] == 0


KILL_AT, WAVE2_AT = 0.1, 1.5


def test_a_killed_prefill_node_is_survived(ray_cluster):
    spec = make_spec(
        prefill={"count": 2, "engine": {"num_gpu_blocks": 1000, "max_num_batched_tokens": 512}},
        links={"kv": {"delay_ms": 1.0}},
        time_scale=1.0,
        kv_pull_timeout_s=0.2,
        kv_pull_deadline_s=1.0,
    )
    # Wave 1 at t=0: 12 prompts per prefill node, one per step (~85 ms each),
    # so prefill-0 still holds queued prompts when it dies at t=0.1 s, also
    # when a loaded machine wakes the kill most of a second late. Wave 2
    # arrives after the kill (with as much room) and must all go to prefill-1.
    wave1 = workload(24, 512, 16, prefix="a")
    wave2 = workload(8, 512, 16, gap_s=0.02, start_s=WAVE2_AT, prefix="b")
    result = run_ray(
        spec, wave1 + wave2, seed=0, handle=ray_cluster, timeout_s=60, faults=[{"kill": "prefill-0", "at": KILL_AT}]
    )
    reasons = collections.Counter(r.finish_reason for r in result.requests)

    assert result.invariant_errors == []  # every request terminal; survivors drained and free
    assert len(result.requests) == len(wave1) + len(wave2)
    assert set(reasons) <= {"length", "error"}
    assert reasons["error"] >= 1  # prompts queued at prefill-0 when it died, failed with a clear status
    assert all(r.finish_reason == "length" for r in result.requests if r.request_id.startswith("b"))
    assert result.node_counters["prefill-0"]["killed"] == 1
    # At its time (never before), and between the waves however late it woke.
    assert KILL_AT <= result.extra["killed"]["prefill-0"] < WAVE2_AT
    decode = result.node_counters["decode-0"]
    # Pulls from the dead node cannot land; the decode node recomputed those.
    assert decode["kv_pulls_failed"] == decode.get("kv_pulls_failed_producer_unavailable", 0) + decode.get(
        "kv_pulls_failed_deadline_exceeded", 0
    )


def test_a_killed_decode_node_s_requests_are_rerouted_to_the_live_one(ray_cluster):
    spec = make_spec(
        decode={"count": 2, "engine": {"num_gpu_blocks": 1000, "async_scheduling": True}},
        links={"kv": {"delay_ms": 1.0}},
        time_scale=0.2,
    )
    # 24 requests of 160 tokens arrive over 0.24 s; decode-0 dies at 0.5 s in the middle of decoding them.
    wl = workload(24, 64, 160, gap_s=0.01)
    result = run_ray(spec, wl, seed=0, handle=ray_cluster, timeout_s=60, faults=[{"kill": "decode-0", "at": 0.5}])

    assert result.invariant_errors == []  # every token once and in order, survivors drained, nothing held
    assert {r.finish_reason for r in result.requests} == {"length"}
    assert result.extra["rerouted"], "no request was re-routed"
    assert result.node_counters["decode-0"]["killed"] == 1
    # the prefill node released what decode-0 had not pulled when the proxy told it, not by a timeout
    assert result.node_counters["prefill-0"]["kv_hold_timeouts"] == 0


def test_a_killed_decode_node_restarts_and_serves_again(ray_cluster):
    """Issue 34: faults on Ray end to end, restart too. decode-0 dies at 0.3 s
    (its requests re-routed to decode-1) and is restarted at 0.8 s as a fresh
    process (back once its actor and stages are up: seconds on a loaded
    machine); requests arriving after that are routed to it again."""
    spec = make_spec(
        decode={"count": 2, "engine": {"num_gpu_blocks": 1000, "async_scheduling": True}},
        links={"kv": {"delay_ms": 1.0}},
        time_scale=0.2,
    )
    early = workload(16, 64, 120, gap_s=0.01, prefix="a")
    late = workload(40, 64, 24, gap_s=0.3, start_s=2.0, prefix="b")  # until 13.7 s
    result = run_ray(
        spec,
        early + late,
        seed=0,
        handle=ray_cluster,
        timeout_s=90,
        faults=[{"kill": "decode-0", "at": 0.3}, {"restart": "decode-0", "at": 0.8}],
        kv_hold_timeout_s=5.0,  # a done report lost under load holds its prompt until then, not 120 s
    )
    assert result.invariant_errors == []  # every token once and in order; both decode nodes drained and free
    assert {r.finish_reason for r in result.requests} == {"length"}
    assert result.extra["rerouted"], "no request was re-routed"
    decode0 = result.node_counters["decode-0"]
    assert decode0["restarts"] == 1 and "killed" not in decode0
    assert (
        0.3 <= result.extra["killed"]["decode-0"] < 0.8 < result.extra["restarted"]["decode-0"] < late[-1].arrival_time
    )
    # the fresh process served some of the late requests (its own counters, since the restart)
    assert decode0["kv_pulls_completed"] > 0
    assert decode0["kv_pulls_completed"] + result.node_counters["decode-1"]["kv_pulls_completed"] >= len(late)
