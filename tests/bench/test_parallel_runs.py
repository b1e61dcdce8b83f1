"""`disagg-sim run --jobs N`: a scenario's in-process runs in worker
processes give the results of running them one after another, in the same
order; a run that raises in a worker ends the sweep naming its run; flags
that watch a run from the parent process are refused with it."""

import json
import multiprocessing
import os
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.parallel_runs import WorkerDied, runs_in_workers, worker_pool
from bench.runner import run_scenario
from bench.scenario import load_scenario
from bench.sweep import RunCrashed, Sweep

TINY = {
    "name": "tiny-jobs",
    "runtime": "inproc",
    "cluster": {
        "prefill": {"count": 1},
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 100, "async_scheduling": True, "max_model_len": 1024}},
    },
    "workload": {"num_requests": 12, "prompt_len": 64, "output_len": 192, "arrival": {"kind": "poisson", "rate": 50}},
    "variants": [
        {"name": "prefix", "set": {"cluster.decode.engine.preemption_guard": "prefix"}},
        {"name": "fixed", "set": {"cluster.decode.engine.preemption_guard": "fixed"}},
    ],
    "repeats": 2,
    "report": {"baseline": "fixed", "plots": False},
}


def _scenario(tmp_path: Path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY, sort_keys=False))
    return load_scenario(path)


def _without_wall_time(result: dict) -> dict:
    out = json.loads(json.dumps(result))
    out["extra"].pop("wall_seconds")
    return out


def test_runs_in_workers_give_the_sequential_results_in_order(tmp_path):
    scenario = _scenario(tmp_path)
    one = run_scenario(scenario, out_dir=tmp_path / "one", jobs=1)
    two = run_scenario(scenario, out_dir=tmp_path / "two", jobs=2)
    keys = [(r["variant"], r["repeat"]) for r in two.results]
    assert keys == [("prefix", 0), ("prefix", 1), ("fixed", 0), ("fixed", 1)]
    assert [_without_wall_time(r) for r in two.results] == [_without_wall_time(r) for r in one.results]
    for name in sorted(p.name for p in (tmp_path / "one").glob("*.steps.jsonl")):
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text()
    assert repr(two.table) == repr(one.table)  # (repr: a ratio may be NaN)
    assert two.threshold_outcomes == one.threshold_outcomes
    assert set(two.runs) == set(one.runs)


class ExplodingScenario:
    """A scenario whose workload for one variant cannot be drawn (a bug in
    a run, as far as the sweep can tell); picklable, for the workers."""

    def __init__(self, scenario, bad_variant: str) -> None:
        self.scenario, self.bad_variant = scenario, bad_variant

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("scenario", "bad_variant"):
            raise AttributeError(name)  # (unpickling looks these up before the instance has them)
        return getattr(self.scenario, name)

    def workload(self, variant: str, seed: int):
        if variant == self.bad_variant:
            raise RuntimeError(f"cannot draw {variant}")
        return self.scenario.workload(variant, seed)


class DyingScenario(ExplodingScenario):
    """A scenario whose worker process dies in one variant's run (as the
    kernel's out-of-memory killer would end it)."""

    def workload(self, variant: str, seed: int):
        if variant == self.bad_variant and multiprocessing.parent_process() is not None:
            os._exit(9)
        return self.scenario.workload(variant, seed)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_that_raises_ends_the_sweep_naming_it(tmp_path, jobs):
    scenario = ExplodingScenario(_scenario(tmp_path), "fixed")
    keys = [("prefix", 0), ("fixed", 0), ("prefix", 1)]
    seen = []
    with pytest.raises(RunCrashed) as info, worker_pool(jobs) as pool:
        for variant, repeat, run, _ in Sweep(scenario, "inproc", out_dir=tmp_path).runs(keys, pool, lambda v, r: None):
            seen.append((variant, repeat, len(run.requests)))
    assert seen == [("prefix", 0, 12)]  # the runs before it came back
    assert (info.value.variant, info.value.repeat, info.value.out_dir) == ("fixed", 0, tmp_path)
    assert "RuntimeError: cannot draw fixed" in str(info.value)
    assert (tmp_path / "tiny-jobs__prefix__r0.json").exists()


def test_a_worker_that_dies_ends_the_sweep_naming_the_runs_not_finished(tmp_path):
    scenario = DyingScenario(_scenario(tmp_path), "fixed")
    keys = [("prefix", 0), ("prefix", 1), ("fixed", 0), ("fixed", 1)]
    seen = []
    with pytest.raises(RunCrashed) as info, worker_pool(2) as pool:
        for variant, repeat, _, _ in Sweep(scenario, "inproc", out_dir=tmp_path).runs(keys, pool, lambda v, r: None):
            seen.append((variant, repeat))
    assert isinstance(info.value.error, WorkerDied)
    assert ("fixed", 0) in info.value.error.unfinished and ("fixed", 0) not in seen
    assert set(info.value.error.unfinished) <= set(keys[len(seen) :])  # runs that finished are not named
    assert "a worker process died (killed by a signal, or out of memory?)" in str(info.value)
    assert info.value.out_dir == tmp_path


def test_leaving_early_stops_the_workers(tmp_path):
    scenario = _scenario(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    sweep = Sweep(scenario, "inproc", out_dir=out)
    with worker_pool(2) as pool:
        runs = runs_in_workers(pool, sweep.finished_run, [("prefix", 0), ("fixed", 0), ("prefix", 1), ("fixed", 1)])
        run, result = runs[0].future.result()
        assert (runs[0].variant, runs[0].repeat, len(run.requests)) == ("prefix", 0, 12)
        assert (result["variant"], result["repeat"], result["extra"]["wall_seconds"] > 0) == ("prefix", 0, True)
        assert (out / "tiny-jobs__prefix__r0.json").exists()  # the worker wrote the run's files
    # Leaving the block shut the pool down: the runs not started were cancelled, the others ended.
    assert all(r.future.done() for r in runs)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--pace", "1"], "--jobs 2 with --pace: these watch a run from this process as it goes; allowed: --jobs 1"),
        (["--metrics-port", "0"], "--jobs 2 with --metrics-port"),
        (["--log-stats", "1"], "--jobs 2 with --log-stats"),
        (["--runtime", "ray"], "--jobs 2: a Ray run uses the Ray cluster's processes; allowed: --jobs 1"),
    ],
)
def test_jobs_are_refused_where_the_parent_watches_the_run(tmp_path, capsys, flags, message):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY, sort_keys=False))
    out = tmp_path / "out"
    assert main(["run", str(path), "--jobs", "2", "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("value", ["0", "-1", "two", "65"])
def test_bad_jobs_values_are_refused_by_the_parser(capsys, value):
    with pytest.raises(SystemExit) as info:
        main(["run", "tiny", "--jobs", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--jobs" in err and ("out of range" in err or "not an integer" in err)
