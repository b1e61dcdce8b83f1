"""`report.stream_records` from the CLI: a run whose finished records are
folded into the metrics and dropped (docs/fleet.md) gives the same serving
metrics as one that keeps them, bit for bit; what needs the records is
refused at load, and a Ray run is refused."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.bench.cli_helpers import cli

SCENARIO = {
    "name": "streamy",
    "runtime": "inproc",
    "cluster": {"prefill": {"count": 2}, "decode": {"count": 3}, "routing": "least_loaded"},
    "workload": {"num_requests": 200, "prompt_len": 64, "output_len": 24, "arrival": {"kind": "poisson", "rate": 50}},
    "report": {"plots": False},
}
STEP_KEYS = {"mean_kv_usage", "max_kv_usage", "mean_batch_size", "total_step_time", "steps_per_node"}


def _run(tmp_path, name: str, report: dict) -> tuple[int, dict, str]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "report": {**SCENARIO["report"], **report}}))
    done = cli("run", str(path), "--out", str(tmp_path / name))
    result_file = tmp_path / name / "streamy__default__r0.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    return done.returncode, result, done.stderr


def test_streamed_records_give_the_same_metrics(tmp_path):
    code, kept, err = _run(tmp_path, "kept", {})
    assert code == 0, err
    code, streamed, err = _run(tmp_path, "streamed", {"stream_records": True})
    assert code == 0, err
    metrics = [k for k in kept if k.endswith("_ms") or k.endswith("throughput") or k in ("completed", "failed")]
    assert len(metrics) > 30
    # The inter-token gaps are counted, not listed: their mean and std agree to the sums' last bits.
    summed = {"mean_itl_ms", "std_itl_ms"}
    assert {k: streamed[k] for k in metrics if k not in summed} == {k: kept[k] for k in metrics if k not in summed}
    assert all(streamed[k] == pytest.approx(kept[k], rel=1e-12) for k in summed)
    assert streamed["nodes"] == kept["nodes"] and streamed["num_steps"] == kept["num_steps"] > 0
    assert streamed["steps_per_node"] == {} and all(streamed.get(k) is None for k in STEP_KEYS - {"steps_per_node"})


def test_what_needs_the_records_is_refused(tmp_path):
    for report in (
        {"stream_records": True, "include_requests": True},
        {"stream_records": True, "slo": {"ttft_ms": 100}},
    ):
        code, _, err = _run(tmp_path, "bad", report)
        assert code == 2 and "stream_records" in err and len(err.strip().splitlines()) == 1, err
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "report": {"stream_records": True}}))
    done = cli("run", str(path), "--runtime", "ray", "--out", str(tmp_path / "ray"))
    assert done.returncode == 2 and "allowed: runtime inproc" in done.stderr, done.stderr
