"""Chaos mode on the virtual clock: a seeded plan of kills, KV partitions,
loss bursts and slow stages is the same for the same seed, never kills the
last node of a role, and a run under it ends with every request finished or
failed with a reason and nothing leaked; a scenario file's `chaos` key
drives it and the results carry the report."""

from __future__ import annotations

import pytest

from bench.scenario import Scenario
from bench.sweep import run_one
from cluster.chaos import ChaosConfig, plan_faults
from cluster.inproc import InProcCluster
from tests.e2e_ray.conftest import make_spec, workload


def test_the_plan_is_seeded_and_spares_the_last_node_of_each_role():
    config = ChaosConfig(seed=7, kills=5, end_s=3.0)
    plan = plan_faults(config, ["prefill-0", "prefill-1"], ["decode-0", "decode-1"])
    assert plan == plan_faults(config, ["prefill-0", "prefill-1"], ["decode-0", "decode-1"])
    assert plan != plan_faults(
        ChaosConfig(seed=8, kills=5, end_s=3.0), ["prefill-0", "prefill-1"], ["decode-0", "decode-1"]
    )
    kills = [f.target for f in plan if f.kind == "kill"]
    assert len(kills) == 2 and len({k.split("-")[0] for k in kills}) == 2  # one of each role, then none left to kill
    assert all(0 <= f.at < 3.0 for f in plan) and plan == sorted(plan, key=lambda f: (f.at, f.kind, f.target))


@pytest.mark.parametrize("seed", range(4))
def test_a_run_under_chaos_loses_and_leaks_nothing(seed):
    spec = make_spec(
        prefill={"count": 2, "engine": {"num_gpu_blocks": 400}},
        decode={"count": 2, "engine": {"num_gpu_blocks": 400, "async_scheduling": True}},
        links={"kv": {"delay_ms": 1.0, "loss": 0.2}, "proxy": {"delay_ms": 1.0, "loss": 0.05}},
        kv_pull_timeout_s=0.2,
        kv_pull_deadline_s=1.0,
        kv_hold_timeout_s=3.0,
    )
    cluster = InProcCluster(spec, seed=seed)
    cluster.submit(workload(80, 64, 32, gap_s=0.03))
    cluster.inject_chaos(ChaosConfig(seed=seed, end_s=2.5, kills=2))
    result = cluster.run()
    report = result.extra["chaos"]
    assert result.invariant_errors == []
    assert report["faults_injected"] == report["faults_survived"] == 8
    assert (report["requests_lost"], report["requests_leaked"]) == (0, 0)
    assert report["requests_finished"] + report["requests_failed"] == 80
    assert len(result.extra["failures"]) == report["requests_failed"]


def test_a_scenario_file_s_chaos_key_drives_the_run():
    raw = {
        "name": "chaos-test",
        "cluster": {
            "prefill": {"count": 2, "engine": {"num_gpu_blocks": 600}},
            "decode": {"count": 2, "engine": {"num_gpu_blocks": 600}},
            "kv_pull_timeout_s": 0.2,
            "kv_pull_deadline_s": 1.0,
            "kv_hold_timeout_s": 3.0,
        },
        "workload": {
            "num_requests": 40,
            "prompt_len": 64,
            "output_len": 16,
            "arrival": {"kind": "poisson", "rate": 40},
        },
        "chaos": {"seed": 3, "end_s": 1.0, "kills": 1},
    }
    result = run_one(Scenario(raw, "test"), "default", 0, "inproc")
    assert result.invariant_errors == []
    assert result.extra["chaos"]["survived"] is True
    assert result.extra["chaos"]["faults_injected"] == 7


def test_killed_nodes_come_back_and_serve_again():
    """Chaos restarts: a killed node returns as a fresh process; the proxy
    routes to it again, and the run still loses and leaks nothing."""
    spec = make_spec(
        prefill={"count": 2, "engine": {"num_gpu_blocks": 2000}},
        decode={"count": 2, "engine": {"num_gpu_blocks": 1000, "async_scheduling": True}},
        kv_pull_timeout_s=0.2,
        kv_pull_deadline_s=1.0,
        kv_hold_timeout_s=3.0,
    )
    cluster = InProcCluster(spec, seed=3)
    cluster.submit(workload(120, 48, 24, gap_s=0.02))
    faults = cluster.inject_chaos(
        ChaosConfig(
            seed=3, end_s=1.0, kills=2, partitions=0, loss_bursts=0, slow_stages=0, restarts=2, restart_after_s=0.3
        )
    )
    kills = [f for f in faults if f.kind == "kill"]
    restarts = [f for f in faults if f.kind == "restart"]
    assert len(kills) == len(restarts) == 2
    assert {f.target for f in kills} == {f.target for f in restarts}
    result = cluster.run()
    report = result.extra["chaos"]
    assert report["survived"] and report["requests_lost"] == 0 and report["requests_leaked"] == 0
    assert result.invariant_errors == []
    for name in {f.target for f in restarts}:
        assert cluster.nodes[name].alive and result.node_counters[name]["restarts"] == 1
    # Requests that arrived after a restart were served by the node that came back too.
    assert all(cluster.nodes[n].core.step_records for n in {f.target for f in restarts})
