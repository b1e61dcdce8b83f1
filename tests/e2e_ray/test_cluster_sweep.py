"""A sweep's in-process runs as Ray tasks (bench/cluster_sweep.py), on the
session's loopback cluster: the results, step traces, table, thresholds and
plots of running them one after another, in the same order; the files are
the driver's; a run that raises ends the sweep naming it.

The multi-node half (several Ray nodes, one lost mid-sweep) is in
test_multi_node.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench.cluster_sweep import ClusterRuns, cluster_jobs
from bench.runner import run_scenario
from bench.scenario import load_scenario
from bench.sweep import RunCrashed, Sweep
from tests.bench.test_parallel_runs import TINY, ExplodingScenario

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def _scenario(tmp_path: Path, **changes):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, **changes}, sort_keys=False))
    return load_scenario(path)


def comparable(out: Path) -> dict[str, object]:
    """Every file a sweep wrote, by name: results JSON less its wall time
    and provenance (what differs by design: the command's, not the run's),
    step traces and plots as bytes."""
    files: dict[str, object] = {}
    for path in sorted(out.rglob("*")):
        if path.suffix == ".json":
            result = json.loads(path.read_text())
            result["extra"].pop("wall_seconds")
            result.pop("provenance", None)
            files[path.name] = result
        elif path.suffix in (".jsonl", ".png"):
            files[str(path.relative_to(out))] = path.read_bytes()
    return files


def test_a_sweep_on_the_cluster_equals_the_sequential_one(tmp_path, ray_cluster):
    scenario = _scenario(tmp_path, report={"baseline": "fixed", "plots": True}, repeats=3)
    one = run_scenario(scenario, out_dir=tmp_path / "one", jobs=1)
    tasks = run_scenario(scenario, out_dir=tmp_path / "tasks", ray_handle=ray_cluster, jobs=2, on_cluster=True)
    keys = [(r["variant"], r["repeat"]) for r in tasks.results]
    assert keys == [("prefix", 0), ("prefix", 1), ("prefix", 2), ("fixed", 0), ("fixed", 1), ("fixed", 2)]
    assert list(tasks.runs) == keys
    reference, ours = comparable(tmp_path / "one"), comparable(tmp_path / "tasks")
    assert sorted(ours) == sorted(reference)
    assert len([n for n in ours if n.endswith(".png")]) >= 2 and len([n for n in ours if n.endswith(".jsonl")]) == 6
    assert ours == reference
    assert repr(tasks.table) == repr(one.table)  # (repr: a ratio may be NaN)
    assert tasks.threshold_outcomes == one.threshold_outcomes
    assert tasks.exit_code == one.exit_code


def test_files_are_written_by_the_driver_and_runs_counted_per_node(tmp_path, ray_cluster):
    scenario = _scenario(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    cluster = ClusterRuns(Sweep(scenario, "inproc", out_dir=out), ray_cluster, jobs=2)
    keys = [("prefix", 0), ("fixed", 0), ("prefix", 1)]
    started = []
    got = list(cluster.runs(keys, lambda v, r: started.append((v, r))))
    assert sorted((v, r) for v, r, _, _ in got) == sorted(keys) and sorted(started) == sorted(keys)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"tiny-jobs__{v}__r{r}.{ext}" for v, r in keys for ext in ("json", "steps.jsonl")
    )
    assert set(cluster.ran_on) == set(keys) and set(cluster.ran_on.values()) == {ray_cluster.driver_node_id}
    assert cluster.reruns == []
    assert cluster.summary_lines() == [
        f"cluster: 3 run(s) as Ray tasks, up to 2 at once; runs per Ray node: {ray_cluster.driver_node_id[:12]} 3"
    ]


def test_a_run_that_raises_on_the_cluster_ends_the_sweep_naming_it(tmp_path, ray_cluster):
    scenario = ExplodingScenario(_scenario(tmp_path), "fixed")
    keys = [("prefix", 0), ("fixed", 0), ("prefix", 1)]
    cluster = ClusterRuns(Sweep(scenario, "inproc", out_dir=tmp_path), ray_cluster, jobs=1)
    seen = []
    with pytest.raises(RunCrashed) as info:
        for variant, repeat, _, _ in cluster.runs(keys, lambda v, r: None):
            seen.append((variant, repeat))
    assert seen == [("prefix", 0)]  # one at a time: the run before it came back, the one after never started
    assert (info.value.variant, info.value.repeat, info.value.out_dir) == ("fixed", 0, tmp_path)
    assert "RuntimeError: cannot draw fixed" in str(info.value)
    assert cluster.reruns == []  # its own error: not re-run


def test_a_trace_ships_with_the_scenario(tmp_path, ray_cluster):
    """The driver reads the trace; the workers never open it (it may not exist on their machines)."""
    trace = tmp_path / "trace.csv"
    trace.write_bytes((Path(__file__).resolve().parents[1] / "data" / "trace_small.csv").read_bytes())
    data = {k: v for k, v in TINY.items() if k != "workload"}
    path = tmp_path / "traced.yaml"
    path.write_text(yaml.safe_dump({**data, "trace": {"path": "trace.csv"}, "repeats": 1}, sort_keys=False))
    one = run_scenario(load_scenario(path), out_dir=tmp_path / "one", jobs=1)
    cluster = ClusterRuns(Sweep(load_scenario(path), "inproc", out_dir=tmp_path / "tasks"), ray_cluster, jobs=2)
    trace.rename(tmp_path / "moved.csv")  # read by the driver, and gone before any task runs
    got = {(v, r): result for v, r, _, result in cluster.runs([("prefix", 0), ("fixed", 0)], lambda v, r: None)}
    assert got[("prefix", 0)]["completed"] == one.results[0]["completed"] > 0
    assert comparable(tmp_path / "tasks") == comparable(tmp_path / "one")


def test_cluster_mode_takes_every_cpu_the_cluster_offers(ray_cluster):
    assert cluster_jobs(ray_cluster, None) == int(ray_cluster.cluster_resources()["CPU"]) >= 1
    assert cluster_jobs(ray_cluster, 3) == 3
