"""Several Ray nodes on one machine (cluster/ray/local_nodes.py: `ray start`
on loopback aliases, token auth on), driven by `disagg-sim run --address`
in a process of its own, as a user would:

- the cascade scenario (shortened) on the Ray runtime with its prefill node
  on one Ray node and its decode node on another (`cluster.placement`, by
  custom resources): the KV server binds its node's own address, TLS is on
  (attached: the default), the KV link's delay applies, thresholds pass;
- a sweep as Ray tasks over both nodes, the one that is not the head killed mid-sweep:
  its run is re-run on the head, the report says so, and every file equals
  the sequential run's (last: it loses a node);
- nothing of the cluster is left running afterwards.

One cluster for the module (starting a node costs 10-40 s on a loaded
2-core machine). This process never joins it: the session's own local
cluster (tests/conftest.py) may be running here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.runner import run_scenario
from bench.scenario import load_scenario
from cluster.ray import processes as ray_processes
from cluster.ray.local_nodes import LocalRayNodes, NodeSpec, node_ip
from tests.bench.test_parallel_runs import TINY
from tests.e2e_ray.test_cluster_sweep import comparable

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
# Two Ray nodes (each start costs seconds): node 0, the head at 127.0.0.2, hosts the drivers, the
# proxy and prefill nodes; node 1 at 127.0.0.3 decode nodes; each runs one of a sweep's tasks at a time.
NODES = [NodeSpec(cpus=1, resources={"host_p": 4}), NodeSpec(cpus=1, resources={"host_d": 4})]
# Runs of ~1 s each: long enough that a run is going on each worker node when one is killed.
SLOW = {**TINY, "name": "slow-sweep", "workload": {**TINY["workload"], "num_requests": 60}, "repeats": 3}


@pytest.fixture(scope="module")
def nodes():
    cluster = LocalRayNodes(NODES)
    with cluster:
        yield cluster
    assert cluster.leftover_pids == set()
    assert ray_processes.session_processes(cluster.temp_dir) == set()


def _cli(nodes: LocalRayNodes, *args: str) -> subprocess.Popen:
    env = dict(nodes.env(), PYTHONPATH=str(REPO), DISAGG_SIM_PROGRESS_S="0")
    return subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "run", *args, "--address", nodes.address],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


TIME_SCALE = 0.05
KV_DELAY_MS = 20.0  # one way, wall: a pull waits a round trip, >= 40 ms (800 ms in model time)


def cascade_across_nodes(directory: Path) -> Path:
    """scenarios/cascade.yaml with its thresholds, scaled down as
    tests/e2e_ray/test_ray_cascade.py does (40 requests of 128 + 224 tokens,
    250 blocks, time_scale 0.05), one repeat, prefill and decode placed on
    different Ray nodes, a KV link delay large enough to see."""
    data = yaml.safe_load((REPO / "scenarios" / "cascade.yaml").read_text())
    cluster = data["cluster"]
    cluster["decode"]["engine"]["num_gpu_blocks"] = 250
    cluster["time_scale"] = TIME_SCALE
    cluster["links"]["kv"] = {"delay_ms": KV_DELAY_MS}
    cluster["placement"] = {"prefill": {"resources": {"host_p": 1}}, "decode": {"resources": {"host_d": 1}}}
    data["workload"] = {"num_requests": 40, "prompt_len": 128, "output_len": 224, "arrival": {"kind": "all_at_once"}}
    data["repeats"] = 1
    data["report"]["percentiles"] = [1, 50, 99]
    data["seed"] = 1
    path = directory / "cascade-across.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_cascade_with_prefill_and_decode_on_different_ray_nodes(tmp_path, nodes):
    out = tmp_path / "out"
    proc = _cli(nodes, str(cascade_across_nodes(tmp_path)), "--out", str(out))
    text, _ = proc.communicate(timeout=400)
    (tmp_path / "cli.txt").write_text(text)
    assert proc.returncode == 0, text[-3000:]  # every threshold passed
    assert "thresholds: 6 passed, 0 failed" in text
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*__r0.json"))]
    assert sorted(r["variant"] for r in results) == ["fence-off", "fixed", "prefix"]
    for result in results:
        extra = result["extra"]
        placed = extra["placement"]
        assert placed["prefill-0"] != placed["decode-0"]
        assert placed["decode-0/stage0"] == placed["decode-0"]
        assert extra["kv_tls"] == "on (cluster.tls=auto; certificates generated for this run)"
        assert str(extra["kv_addresses"]["prefill-0"]).startswith(node_ip(0))  # its node's own address
        assert (extra["kv_pulls"]["completed"], extra["kv_pulls"]["failed"], extra["completed"]) == (40, 0, True)
        assert result["completed"] == 40 and result["failed"] == 0
        # The link's delay still applies: every pull waited at least about one round trip (wall = model x scale).
        assert result["p1_remote_kv_wait_ms"] * TIME_SCALE >= 0.9 * 2 * KV_DELAY_MS, result["variant"]


def test_a_node_lost_mid_sweep_has_its_run_rerun_elsewhere(tmp_path, nodes):
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(SLOW, sort_keys=False))
    reference = tmp_path / "one"
    run_scenario(load_scenario(path), out_dir=reference, jobs=1)

    out = tmp_path / "tasks"
    proc = _cli(nodes, str(path), "--jobs", "2", "--out", str(out))
    deadline = time.monotonic() + 300
    # A run back first (the ones before the loss are kept), then node 1 killed while it runs one.
    while proc.poll() is None and time.monotonic() < deadline:
        if list(out.glob("*.json")) and nodes.running(1, "disagg-sim-run"):
            break
        time.sleep(0.01)
    nodes.kill(1)
    text, _ = proc.communicate(timeout=300)
    (tmp_path / "cli.txt").write_text(text)
    assert proc.returncode == 0, text[-3000:]
    assert "as Ray tasks" in text
    assert "run(s) re-run after a lost worker:" in text, text[-3000:]
    assert "its worker was lost (" in text and "re-run, attempt 2" in text
    assert comparable(out) == comparable(reference)
    assert len(list(out.glob("*.json"))) == 6
    assert "cluster: 6 run(s) as Ray tasks, up to 2 at once; runs per Ray node: " in text
