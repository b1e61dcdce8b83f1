"""Several Ray nodes on one machine (cluster/ray/local_nodes.py: `ray start`
on loopback aliases, token auth on), driven by `disagg-sim run --address`
in a process of its own, as a user would:

- a sweep as Ray tasks over two worker nodes, one of them killed mid-sweep:
  its run is re-run on the other, the report says so, and every file equals
  the sequential run's;
- nothing of the cluster is left running afterwards.

One cluster for the module (starting a node costs 10-40 s on a loaded
2-core machine). This process never joins it: the session's own local
cluster (tests/conftest.py) may be running here.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.runner import run_scenario
from bench.scenario import load_scenario
from cluster.ray import processes as ray_processes
from cluster.ray.local_nodes import LocalRayNodes, NodeSpec
from tests.bench.test_parallel_runs import TINY
from tests.e2e_ray.test_cluster_sweep import comparable

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
# Node 0, the head, runs the drivers' side (no CPU for runs); 1 and 2 run the sweep's tasks.
NODES = [NodeSpec(cpus=0), NodeSpec(cpus=1), NodeSpec(cpus=1)]
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


def test_a_node_lost_mid_sweep_has_its_run_rerun_elsewhere(tmp_path, nodes):
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(SLOW, sort_keys=False))
    reference = tmp_path / "one"
    run_scenario(load_scenario(path), out_dir=reference, jobs=1)

    out = tmp_path / "tasks"
    proc = _cli(nodes, str(path), "--jobs", "2", "--out", str(out))
    deadline = time.monotonic() + 300
    # The first run back: both worker nodes are busy with one run each (2 CPUs, 2 at once, 6 runs).
    while not list(out.glob("*.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    nodes.kill(2)
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, text[-3000:]
    assert "as Ray tasks" in text
    assert "run(s) re-run after a lost worker:" in text, text[-3000:]
    assert "its worker was lost (" in text and "re-run, attempt 2" in text
    assert comparable(out) == comparable(reference)
    assert len(list(out.glob("*.json"))) == 6
    assert "cluster: 6 run(s) as Ray tasks, up to 2 at once; runs per Ray node: " in text
