"""From the CLI: `compare` reads at 80 and 200 columns — a metric per row as
in `run`'s table, wrapped to the width, never a name cut — and speaks
Markdown, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json

import pytest

from bench.compare import DEFAULT_TABLE_METRICS
from tests.bench.cli_helpers import cli, tiny_results

VARIANTS = {
    "fixed-guard": [(2, 0, 0.5), (4, 0, 1.5)],
    "prefix-guard": [(40, 10, 1.0), (60, 30, 3.0)],
    "fence-off-guard": [(3, 0, 0.6), (5, 0, 1.4)],
}


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory):
    d = tmp_path_factory.mktemp("sets")
    return [f"base={tiny_results(d, VARIANTS, 'a')}", f"cand={tiny_results(d, VARIANTS, 'b')}"]


def _shown_metrics(text: str) -> set[str]:
    return {
        line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│") and line.split("│")[1].strip()
    }


@pytest.mark.parametrize("columns,tables", [(80, 3), (200, 1)])
def test_compare_fits_the_width_and_never_cuts_a_name(two_sets, columns, tables):
    done = cli("compare", *two_sets, columns=columns)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    heads = [line for line in lines if line.startswith("mean ± std over repeats")]
    assert len(heads) == tables
    metrics = [m for m in DEFAULT_TABLE_METRICS if m in done.stdout]
    assert {"completed", "failed", "num_preemptions", "num_zero_progress_preemptions"} <= set(metrics)
    # Every metric whole on its own row, in every wrapped table; every variant whole in a header.
    assert _shown_metrics(done.stdout) == set(metrics)
    assert sum(line.startswith("│ num_zero_progress_preemptions ") for line in lines) == tables
    for label in ("base", "cand"):
        for v in VARIANTS:
            assert f"{label}/{v}" in done.stdout


def test_compare_markdown_csv_json(two_sets):
    args = (
        "compare",
        *two_sets,
        "--baseline",
        "base/fixed-guard",
        "--metric",
        "num_preemptions",
        "--threshold",
        "num_preemptions[cand/prefix-guard] > 1",
    )
    md = cli(*args, "--format", "markdown")
    assert md.returncode == 0
    lines = md.stdout.splitlines()
    # The first set's variants are against its baseline, marked as in `run`'s table.
    head = "| metric | base/fence-off-guard n=2 | base/fixed-guard (baseline) n=2 | base/prefix-guard n=2 |"
    assert lines[2].startswith(head)
    assert lines[3] == "|---|" + "---:|" * 6
    assert lines[4].startswith("| num_preemptions | 4 ± 1.414 (×1.333) | 3 ± 1.414 | 50 ± 14.14 (×16.67) |")
    assert "| PASS | `num_preemptions[cand/prefix-guard] > 1` | 50 | 1 |" in lines
    rows = list(csv.DictReader(io.StringIO(cli(*args, "--format", "csv").stdout)))
    assert len(rows) == 6
    assert rows[2] == {
        "variant": "base/prefix-guard",
        "metric": "num_preemptions",
        "n": "2",
        "mean": "50.0",
        "std": "14.142135623730951",
        "ratio": repr(50 / 3),
    }
    doc = json.loads(cli(*args, "--format", "json").stdout)
    assert doc["variants"]["cand/prefix-guard"]["num_preemptions"]["ratio"] == 1.0
    assert doc["thresholds"][0]["passed"] is True


def test_table_ratio_equals_the_thresholds_ratio(two_sets):
    """One way to compute a ratio: the table's (×r) is what `m[a] / m[b]` evaluates to."""
    doc = json.loads(
        cli(
            "compare",
            two_sets[0].split("=", 1)[1],
            "--baseline",
            "fixed-guard",
            "--metric",
            "num_preemptions",
            "--format",
            "json",
            "--threshold",
            "num_preemptions[prefix-guard] / num_preemptions[fixed-guard] > 0",
        ).stdout
    )
    assert doc["thresholds"][0]["lhs"] == doc["variants"]["prefix-guard"]["num_preemptions"]["ratio"]


def test_compare_help_describes_every_flag():
    text = cli("compare", "--help", columns=100).stdout
    for flag in ("--threshold", "--baseline", "--metric", "--format", "--json"):
        block = text.split(flag, 1)[1].split("\n  -", 1)[0]
        assert len(block.split()) > 3, flag


def test_a_bad_threshold_is_one_line_on_stderr_with_json_on_stdout(two_sets):
    done = cli("compare", *two_sets, "--format", "json", "--threshold", "ttft_p99_ms[base/fixed-guard] < 1")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "error: unknown metric 'ttft_p99_ms' for variant 'base/fixed-guard'; did you mean p99_ttft_ms?\n"
    )
