"""Faults on Ray through `disagg-sim run`, end to end (issue 34, finding 3):
a scenario with a killed and restarted decode node, KV loss and a KV outage runs on the
session's loopback cluster (attached with its token, `--address`), writes
its results and ends with exit 0: every request terminal, the killed node's
counters in the same schema as in-process (ints), when it died in `extra`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster.ray.env import ray

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

KILL_AT = 0.6
SCENARIO = {
    "name": "ray-faults",
    "runtime": "ray",
    "cluster": {
        "decode": {"count": 2, "engine": {"num_gpu_blocks": 200, "async_scheduling": True, "max_model_len": 512}},
        "links": {"kv": {"delay_ms": 1.0, "loss": 0.2, "outages": [[0.3, 0.5]]}},
        "time_scale": 0.5,
        "kv_pull_timeout_s": 0.2,
        "kv_pull_deadline_s": 1.0,
        # A done or failure report lost to the loss or the outage leaves the
        # producer holding the prompt until its hold timeout (as vLLM's would):
        # short here, so the run drains (tests/e2e_ray/test_ray_faults.py too).
        "kv_hold_timeout_s": 1.5,
    },
    "workload": {"num_requests": 24, "prompt_len": 64, "output_len": 32, "arrival": {"kind": "constant", "rate": 20}},
    # (the restart is due before the last request: the run waits for it to be done)
    "faults": [{"kill": "decode-1", "at": KILL_AT}, {"restart": "decode-1", "at": KILL_AT + 0.4}],
    "repeats": 1,
    "seed": 5,
    "thresholds": ["completed[default] + failed[default] == 24"],
}


def test_a_ray_scenario_with_kill_restart_loss_and_outage_writes_its_results(ray_cluster, tmp_path):
    scenario = tmp_path / "ray-faults.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "out"
    cli = Path(sys.executable).with_name("disagg-sim")
    run = subprocess.run(
        [str(cli), "run", str(scenario), "--address", ray.get_runtime_context().gcs_address, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=200,
        env=dict(os.environ),  # the session cluster's token (cluster/ray/auth.py)
    )
    assert run.returncode == 0, run.stderr[-2000:]
    (path,) = out.glob("ray-faults__*__r0.json")
    result = json.loads(path.read_text())
    assert result["completed"] + result["failed"] == 24
    assert set(result["extra"]["killed"]) == {"decode-1"}
    assert result["extra"]["killed"]["decode-1"] >= KILL_AT
    # back as a fresh process (its counters since then, with `restarts`)
    assert result["extra"]["restarted"]["decode-1"] > result["extra"]["killed"]["decode-1"]
    assert result["restarts"] == 1
    counters = [v for k, v in result.items() if k.startswith("num_") or k.startswith("kv_pulls")]
    assert counters and all(isinstance(v, int) for v in counters)
