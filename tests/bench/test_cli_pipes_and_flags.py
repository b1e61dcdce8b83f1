"""From the CLI: output to a closed pipe ends quietly with exit 0 (as `head`
users expect), a crash leaves its traceback in the results directory, flags
are never abbreviated and an unknown one gets a "did you mean"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.bench.cli_helpers import ROOT, cli, tiny_results


def _into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI with stdout a pipe whose reader is already gone: its
    first write fails with EPIPE, every time (no race with a reader)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "bench.cli", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [("schema", "--metrics", "cascade-inproc"), ("schema",), ("scenarios",)])
def test_plain_output_to_a_closed_pipe_exits_0_quietly(args):
    done = _into_closed_pipe(*args)
    assert (done.returncode, done.stderr) == (0, "")


def test_rich_table_to_a_closed_pipe_exits_0_quietly(tmp_path):
    done = _into_closed_pipe("compare", str(tiny_results(tmp_path)))
    assert (done.returncode, done.stderr) == (0, "")


def test_a_crash_leaves_its_traceback_in_the_results_directory(tmp_path, monkeypatch, capsys):
    from bench import cli, runner

    def broken(*a, **k):
        raise RuntimeError("plotting fell over")

    monkeypatch.setattr(runner, "run_scenario", broken)
    out = tmp_path / "out"
    assert cli.main(["run", "cascade-inproc", "--out", str(out)]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: the simulator failed (a bug, not your input): RuntimeError: plotting fell over")
    assert f"traceback in {out / 'error.log'}" in err
    assert "plotting fell over" in (out / "error.log").read_text()


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["run", "cascade-inproc", "--repeat", "2"],
            "error: disagg-sim: unrecognized arguments: --repeat 2; did you mean --repeats?",
        ),
        (
            ["run", "cascade-inproc", "--metric", "5"],
            "error: disagg-sim: unrecognized arguments: --metric 5; did you mean --metrics-port?",
        ),
        (
            ["run", "cascade-inproc", "--net-delay-ms", "5"],
            "error: disagg-sim: unrecognized arguments: --net-delay-ms 5; did you mean --net-delay?",
        ),
        (
            ["compare", "x", "--metrics", "a"],
            "error: disagg-sim: unrecognized arguments: --metrics a; did you mean --metric?",
        ),
    ],
)
def test_flags_are_not_abbreviated_and_a_misspelt_one_is_named(args, message):
    done = cli(*args)
    assert done.returncode == 2
    assert done.stderr.strip() == message + " (see disagg-sim --help)"


def test_a_misspelt_metric_is_matched_by_meaning(tmp_path):
    done = cli("compare", str(tiny_results(tmp_path)), "--threshold", "ttft_p99_ms[fixed] < 1")
    assert done.returncode == 2
    assert "unknown metric 'ttft_p99_ms' for variant 'fixed'; did you mean p99_ttft_ms?" in done.stdout + done.stderr
