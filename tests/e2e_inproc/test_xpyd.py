"""The P:D ratio sweep (scenarios/xpyd.yaml) at a reduced size: every
split of the 8 GPUs runs, each result carries its goodput under the
scenario's SLO, and the report names the goodput-optimal ratio."""

from __future__ import annotations

import io
import json

from rich.console import Console

from bench.runner import best_variant, run_scenario
from bench.scenario import load_scenario

RATIOS = ["1P7D", "2P6D", "3P5D", "4P4D", "5P3D", "6P2D", "7P1D"]


def test_the_sweep_names_the_goodput_optimal_ratio(tmp_path):
    scenario = load_scenario("xpyd").with_overrides({"workload.num_requests": 160})
    console = Console(file=io.StringIO(), width=200)
    outcome = run_scenario(scenario, console=console, out_dir=tmp_path)
    assert outcome.invariant_errors == []
    goodput = {r["variant"]: r["request_goodput"] for r in outcome.results}
    assert list(goodput) == RATIOS
    assert outcome.best is not None
    best, value = outcome.best
    assert value == max(goodput.values()) > 0 and goodput[best] == value
    # Neither extreme: one prefill GPU queues the prompts, one decode GPU misses the TPOT target.
    assert best not in ("1P7D", "7P1D") and goodput["1P7D"] < value and goodput["7P1D"] < value
    assert f"best variant by request_goodput (max): {best}" in console.file.getvalue()
    assert json.loads((tmp_path / "best.json").read_text())["variant"] == best


def test_the_best_variant_is_the_best_mean_over_repeats():
    results = [
        {"variant": "a", "request_goodput": 2.0},
        {"variant": "b", "request_goodput": 3.0},
        {"variant": "b", "request_goodput": 1.0},
        {"variant": "c", "request_goodput": 2.5},
    ]
    assert best_variant(results, "request_goodput", "max") == ("c", 2.5)
    assert best_variant(results, "request_goodput", "min") == ("a", 2.0)  # b's mean is 2.0 too: a ran first
    assert best_variant(results, "missing", "max") is None
