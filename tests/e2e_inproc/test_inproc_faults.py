"""Faults on the virtual clock end with every request finished or failed
with a reason, and no block held on any live node (`NodeRole.report`'s
end-of-run checks are in `invariant_errors`): KV loss from 0.1 to 0.9, a KV
outage longer than the pull deadline, killed decode and prefill nodes, and
loss on the proxy link, which costs retransmissions but never reorders."""

from __future__ import annotations

import collections
import statistics

import pytest

from cluster.inproc import InProcCluster
from tests.e2e_ray.conftest import make_spec, workload

FAST_POLICY = {"kv_pull_timeout_s": 0.2, "kv_pull_deadline_s": 1.0, "kv_hold_timeout_s": 3.0}


def run(spec, wl, seed=0, kills=()):
    cluster = InProcCluster(spec, seed=seed)
    cluster.submit(wl)
    for name, at in kills:
        cluster.kill_node_at(name, at)
    return cluster.run()


def assert_clean(result, n):
    assert result.invariant_errors == []  # every request terminal, tokens right, pools free, nothing held
    assert len(result.requests) == n
    failed = [r.request_id for r in result.requests if r.finish_reason == "error"]
    assert sorted(result.extra["failures"]) == sorted(failed)  # every failure has its reason
    assert all(result.extra["failures"].values())


@pytest.mark.parametrize("loss", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_kv_loss_ends_with_every_request_served_and_no_block_held(loss):
    spec = make_spec(links={"kv": {"delay_ms": 1.0, "loss": loss}}, **FAST_POLICY)
    result = run(spec, workload(60, 64, 16, gap_s=0.01))
    assert_clean(result, 60)
    decode, prefill = result.node_counters["decode-0"], result.node_counters["prefill-0"]
    # recompute is the load-failure policy: a pull that fails costs time, not the request
    assert collections.Counter(r.finish_reason for r in result.requests) == {"length": 60}
    assert decode["kv_pulls_completed"] + decode["kv_pulls_failed"] == 60
    assert decode["transport_retries"] > 0
    # every held request was released: by its done report, or by the hold timeout
    assert prefill["kv_done_reports"] - prefill["kv_late_done_reports"] + prefill["kv_hold_timeouts"] == 60


def test_a_small_prefill_pool_at_half_loss_serves_every_request():
    spec = make_spec(
        prefill={"count": 1, "engine": {"num_gpu_blocks": 60}},
        links={"kv": {"delay_ms": 1.0, "loss": 0.5}},
        **FAST_POLICY,
    )
    result = run(spec, workload(300, 64, 16, gap_s=0.005))
    assert_clean(result, 300)
    assert {r.finish_reason for r in result.requests} == {"length"}


@pytest.mark.parametrize("policy, reason", [("recompute", "length"), ("fail", "error")])
def test_an_outage_longer_than_the_deadline_ends_clean(policy, reason):
    spec = make_spec(
        decode={"count": 1, "engine": {"num_gpu_blocks": 1000, "kv_load_failure_policy": policy}},
        links={"kv": {"delay_ms": 1.0, "outages": [[0.1, 5.0]]}},
        **FAST_POLICY,
    )
    result = run(spec, workload(60, 64, 16, gap_s=0.01))
    assert_clean(result, 60)
    decode = result.node_counters["decode-0"]
    assert decode["kv_pulls_failed"] == decode["kv_pulls_failed_deadline_exceeded"] > 0
    late = [r for r in result.requests if r.remote_kv_wait_start is not None and r.remote_kv_wait_start >= 0.1]
    assert late and all(r.finish_reason == reason for r in late)
    # failure reports sent in the outage are lost: the hold timeout frees those blocks
    assert result.node_counters["prefill-0"]["kv_hold_timeouts"] > 0


def test_a_killed_decode_node_s_requests_are_rerouted_and_continue_exactly():
    spec = make_spec(
        decode={"count": 2, "engine": {"num_gpu_blocks": 1000, "async_scheduling": True}},
        links={"kv": {"delay_ms": 1.0}},
    )
    result = run(spec, workload(60, 64, 64, gap_s=0.01), kills=[("decode-0", 0.3)])
    assert_clean(result, 60)  # re-routed tokens continue the stream: no gap, duplicate or reorder
    assert {r.finish_reason for r in result.requests} == {"length"}
    rerouted = result.extra["rerouted"]
    assert rerouted and set(rerouted.values()) == {1}
    assert result.node_counters["decode-0"]["killed"] == 1
    # the blocks of requests that had not been pulled yet were released by the proxy, not by a timeout
    assert result.node_counters["prefill-0"]["kv_hold_timeouts"] == 0


def test_with_no_decode_node_left_requests_fail_with_a_reason():
    spec = make_spec(links={"kv": {"delay_ms": 1.0}})
    result = run(spec, workload(30, 64, 64, gap_s=0.02), kills=[("decode-0", 0.2)])
    assert_clean(result, 30)
    reasons = collections.Counter(r.finish_reason for r in result.requests)
    assert reasons["error"] > 0 and set(reasons) <= {"length", "error"}
    assert all(why in ("decode-0 was killed", "no live decode node") for why in result.extra["failures"].values())
    assert result.node_counters["prefill-0"]["kv_hold_timeouts"] == 0  # released by the proxy


def test_a_killed_prefill_node_fails_its_prompts_with_a_reason_and_the_rest_are_served():
    spec = make_spec(prefill={"count": 2, "engine": {"num_gpu_blocks": 1000}}, links={"kv": {"delay_ms": 1.0}})
    result = run(spec, workload(60, 64, 16, gap_s=0.01), kills=[("prefill-0", 0.2)])
    assert_clean(result, 60)
    assert set(result.extra["failures"].values()) <= {"prefill-0 was killed"}


@pytest.mark.parametrize("loss", [0.2, 0.5])
def test_proxy_link_loss_costs_retransmissions_and_never_reorders_tokens(loss):
    wl = workload(40, 64, 16, gap_s=0.01)

    def ttft(result):
        return statistics.median(r.token_times[0] - r.arrival_time for r in result.requests)

    clean = run(make_spec(links={"proxy": {"delay_ms": 5.0, "jitter_ms": 2.0}}), wl)
    lossy = run(make_spec(links={"proxy": {"delay_ms": 5.0, "jitter_ms": 2.0, "loss": loss}}), wl)
    assert_clean(lossy, 40)  # tokens in order, none missing or duplicated
    for rec in lossy.requests:
        assert rec.token_times == sorted(rec.token_times)
    assert ttft(lossy) > ttft(clean) + 0.2  # a loss is one retransmission timeout (200 ms) at least


@pytest.mark.parametrize("decode_count", [1, 2])
def test_a_broken_stage_link_fails_or_reroutes_every_request_of_its_node(decode_count):
    """Issue 34, finding 4: a stage link that breaks (loss, then an outage
    outlasting TCP's retransmissions) stopped its decode node's engine loop
    and left the node's requests neither finished nor failed (exit 3), or
    crashed the run handing it more. The node now leaves the run as a dead
    one does: the proxy re-routes or fails every request it had, saying why."""
    spec = make_spec(
        decode={"count": decode_count, "pp_size": 2, "engine": {"num_gpu_blocks": 500, "async_scheduling": True}},
        links={
            "proxy": {"delay_ms": 1.0, "loss": 0.5},
            "stage": {"delay_ms": 1.0, "loss": 0.5, "outages": [[2.0, 40.0]]},
        },
        **FAST_POLICY,
    )
    result = run(spec, workload(60, 128, 64, gap_s=0.05))
    assert_clean(result, 60)
    # Requests on a node when its link broke fail with that reason (or move
    # to a live node); those that arrive after every decode node is gone, with that.
    reasons = {"stage link" if "a stage link broke" in why else why for why in result.extra["failures"].values()}
    assert reasons == {"stage link", "no live decode node"}
    assert all(result.node_counters[f"decode-{i}"]["killed"] == 1 for i in range(decode_count))
