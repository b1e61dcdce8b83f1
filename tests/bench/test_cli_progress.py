"""From the CLI: a run whose stdout is not a terminal (a log, CI, a pipe)
says how it goes, per run and within a run, in plain lines."""

from __future__ import annotations

import re

import yaml

from tests.bench.cli_helpers import cli

TINY = {
    "name": "tiny",
    "runtime": "inproc",
    "cluster": {
        "prefill": {"count": 1},
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 100, "max_model_len": 1024}},
    },
    "workload": {"num_requests": 6, "prompt_len": 64, "output_len": 32, "arrival": {"kind": "all_at_once"}},
    "variants": [{"name": "fixed", "set": {}}],
    "repeats": 2,
    "report": {"plots": False},
}


def test_no_tty_run_prints_plain_progress_lines(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY))
    done = cli("run", str(scenario), "--out", str(tmp_path / "out"), env={"DISAGG_SIM_PROGRESS_S": "0"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    progress = [line for line in lines if line.startswith(("run ", "  fixed"))]
    within = r"  fixed r{r}: {k}/6 requests finished, \d+\.\d s simulated"
    expected = []
    for r in range(2):
        expected.append(rf"run {r + 1}/2: fixed r{r} \.\.\.")
        expected += [within.format(r=r, k=k) for k in range(1, 7)]
        expected.append(rf"run {r + 1}/2: fixed r{r} done in \d+\.\d s: 6 completed, 0 failed")
    assert len(progress) == len(expected), progress
    for line, pattern in zip(progress, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    # No terminal escape codes in a log.
    assert "\x1b[" not in done.stdout


def test_within_run_lines_are_throttled_by_default(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY))
    done = cli("run", str(scenario), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "requests finished" not in done.stdout  # each run takes well under the 5 s between lines
    assert "run 2/2: fixed r1 done in" in done.stdout


def test_no_tty_validate_cost_prints_a_line_per_point_and_within_it(tmp_path):
    points = ["gpustack-qwen3-8b-h100-sharegpt-c4", "cloudera-qwen2-7b-a100-80gb-kv24g-random-1k1k-n1"]
    argv = ["validate-cost", "--out", str(tmp_path / "v.md"), "--results", str(tmp_path / "r.json")]
    done = cli(*argv, *(a for p in points for a in ("--only", p)), env={"DISAGG_SIM_PROGRESS_S": "0"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    per_point = [line for line in lines if line.startswith("point ")]
    errors = r"held-out error TTFT [+-]\d+%  TPOT [+-]\d+%  throughput [+-]\d+%"
    expected = []
    for i, point in enumerate(points, 1):
        expected += [rf"point {i}/2: {point} \.\.\.", rf"point {i}/2: {point} done in \d+\.\d s: {errors}"]
    assert len(per_point) == len(expected), per_point
    for line, pattern in zip(per_point, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    # Within the one-request point: a line as its request finishes, in its in-sample and its held-out run.
    start = lines.index(f"point 2/2: {points[1]} ...")
    within = lines[start + 1 : start + 3]
    assert all(re.fullmatch(rf"  {points[1]}: 1/1 requests finished, \d+\.\d s simulated", x) for x in within), within
    assert lines[start + 3].startswith(f"point 2/2: {points[1]} done in ")
    assert "\x1b[" not in done.stdout and done.stderr == ""
