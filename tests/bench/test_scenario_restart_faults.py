"""A scenario's `faults:` may restart a node killed before (issue 34): in
process the node comes back as a fresh one and serves again; a restart that
follows no kill of its node is refused at load (exit 2, one line). On Ray:
tests/e2e_ray/test_ray_fault_scenario.py."""

from __future__ import annotations

import json

import yaml

from tests.bench.cli_helpers import cli

BASE = {
    "name": "restarts",
    "cluster": {"decode": {"count": 2, "engine": {"num_gpu_blocks": 1000}}},
    "workload": {"num_requests": 60, "prompt_len": 64, "output_len": 32, "arrival": {"kind": "constant", "rate": 20}},
}


def test_a_killed_node_restarted_by_the_scenario_serves_again(tmp_path):
    scenario = tmp_path / "s.yaml"
    faults = [{"kill": "decode-1", "at": 0.5}, {"restart": "decode-1", "at": 1.5}]
    scenario.write_text(yaml.safe_dump({**BASE, "faults": faults}))
    r = cli("run", str(scenario), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (path,) = (tmp_path / "out").glob("restarts__*__r0.json")
    result = json.loads(path.read_text())
    assert (result["completed"], result["failed"], result["restarts"]) == (60, 0, 1)


def test_a_restart_without_a_kill_before_it_is_refused(tmp_path):
    scenario = tmp_path / "s.yaml"
    faults = [{"restart": "decode-1", "at": 1.5}, {"kill": "decode-1", "at": 2.0}]
    scenario.write_text(yaml.safe_dump({**BASE, "faults": faults}))
    r = cli("run", str(scenario), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {scenario}:8: faults[0].restart='decode-1' at 1.5 s follows no kill of it; allowed: after its kill"
    ]
