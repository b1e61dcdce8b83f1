"""A scenario's missing trace is shown where it was looked for: the absolute
path, and what a relative `trace.path` is relative to (the scenario file's
directory, not the working directory) — from the CLI, run elsewhere. An
empirical lengths file likewise: relative to the scenario file, found there
from any working directory, and its results name the file read."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys

import yaml

from tests.bench.cli_helpers import ROOT
from tests.bench.test_bad_input import BASE


def _cli(cwd, *args):
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "bench.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)  # fmt: skip


def _trace_scenario(path, trace_path):
    doc = copy.deepcopy(BASE)
    doc.pop("workload")
    doc["trace"] = {"path": trace_path}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_relative_trace_path_names_the_scenario_directory(tmp_path):
    _trace_scenario(tmp_path / "exp" / "s.yaml", "traces/day1.jsonl")
    (tmp_path / "traces").mkdir()  # beside the working directory, where a user may think it is looked for
    shutil.copy(ROOT / "tests" / "data" / "mooncake_small.jsonl", tmp_path / "traces" / "day1.jsonl")
    for command in (["validate"], ["run", "--out", "out"]):
        done = _cli(tmp_path, command[0], "exp/s.yaml", *command[1:])
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr == (
            f"error: exp/s.yaml:24: trace: traces/day1.jsonl: trace file not found at "
            f"{tmp_path / 'exp' / 'traces' / 'day1.jsonl'} (trace.path is relative to the scenario file's "
            f"directory, {tmp_path / 'exp'}); allowed: an existing .jsonl or .csv trace file\n"
        )
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_an_absolute_trace_path_says_so_also_when_a_result_is_rerun(tmp_path):
    missing = tmp_path / "gone.jsonl"
    _trace_scenario(tmp_path / "s.yaml", str(missing))
    done = _cli(tmp_path, "validate", "s.yaml")
    assert done.returncode == 2
    assert done.stderr == (
        f"error: s.yaml:24: trace: {missing}: trace file not found at {missing} (an absolute path); "
        "allowed: an existing .jsonl or .csv trace file\n"
    )
    # A result that replayed a trace since moved away.
    missing.write_text("".join(f'{{"timestamp": {i}, "input_length": 32, "output_length": 4}}\n' for i in range(3)))
    assert _cli(tmp_path, "run", "s.yaml", "--only", "a", "--out", "out").returncode == 0
    result = tmp_path / "out" / "tiny__a__r0.json"
    assert json.loads(result.read_text())["scenario_config"]["trace_sha256"]
    missing.unlink()
    done = _cli(tmp_path, "run", str(result), "--out", "again")
    assert done.returncode == 2
    assert done.stderr == (
        f"error: {tmp_path / 's.yaml'}: trace: {missing}: trace file not found at {missing} (an absolute path); "
        "allowed: an existing .jsonl or .csv trace file\n"
    )


def test_a_missing_empirical_lengths_file_is_shown_resolved_too(tmp_path):
    doc = copy.deepcopy(BASE)
    doc["workload"]["prompt_len"] = {"kind": "empirical", "path": "lengths_cdf.csv"}
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(ROOT / "tests" / "data" / "lengths_cdf.csv", tmp_path)  # beside the working directory: not read
    done = _cli(tmp_path, "validate", "exp/s.yaml")
    assert (done.returncode, done.stdout) == (2, "")
    exp = tmp_path / "exp"
    assert "lengths_cdf.csv: empirical CDF file not found at " in done.stderr, done.stderr
    assert done.stderr.endswith(f"{exp / 'lengths_cdf.csv'} (relative to the scenario file's directory, {exp})\n"), (
        done.stderr
    )


def test_an_empirical_lengths_file_beside_the_scenario_is_read_from_anywhere(tmp_path):
    from bench.scenario import load_scenario

    doc = copy.deepcopy(BASE)
    doc["workload"]["prompt_len"] = {"kind": "empirical", "path": "lengths_cdf.csv"}
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(ROOT / "tests" / "data" / "lengths_cdf.csv", tmp_path / "exp")
    scenario = load_scenario(tmp_path / "exp" / "s.yaml")  # the working directory is the repository's
    spec = scenario.workload_spec(scenario.variant_names[0])
    assert spec.prompt_len.path == str(tmp_path / "exp" / "lengths_cdf.csv")
    lengths = {r.prompt_len for r in scenario.workload(scenario.variant_names[0], seed=0)[0]}
    assert lengths <= {16, 64, 256}
