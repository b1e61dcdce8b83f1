"""From the CLI: `compare` takes ratios against the scenario's declared
baseline, else its first variant (not the alphabetically first file), and
with labelled sets against that variant of the first set."""

from __future__ import annotations

import json

import yaml

from tests.bench.cli_helpers import cli

SCENARIO = {
    "name": "order",
    "runtime": "inproc",
    "cluster": {"prefill": {"count": 0}, "decode": {"engine": {"num_gpu_blocks": 64, "max_model_len": 512}}},
    "workload": {"num_requests": 6, "prompt_len": 64, "output_len": 48, "arrival": {"kind": "all_at_once"}},
    # Declared first, alphabetically last.
    "variants": [
        {"name": "zeta", "set": {"cluster.decode.engine.preemption_guard": "fixed"}},
        {"name": "alpha", "set": {"cluster.decode.engine.preemption_guard": "prefix"}},
        {"name": "mid", "set": {"cluster.decode.engine.num_gpu_blocks": 200}},
    ],
    "report": {"plots": False},
}


def _run(tmp_path, name: str, doc: dict):
    scenario = tmp_path / f"{name}.yaml"
    scenario.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = cli("run", str(scenario), "--out", str(tmp_path / name))
    assert done.returncode == 0, done.stderr
    return tmp_path / name


def _compare(*args: str) -> dict:
    done = cli("compare", *args, "--metric", "mean_e2el_ms", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_baseline_is_the_scenarios_not_the_alphabets(tmp_path):
    a = _run(tmp_path, "a", SCENARIO)
    b = _run(tmp_path, "b", {**SCENARIO, "seed": 1})
    doc = _compare(f"a={a}", f"b={b}")
    assert doc["baseline"] == "a/zeta"  # the scenario's first variant, of the first set
    assert doc["baseline_of"] == {"b/zeta": "a/zeta", "b/alpha": "a/alpha", "b/mid": "a/mid"}
    cells = {v: row["mean_e2el_ms"] for v, row in doc["variants"].items()}
    assert cells["a/zeta"]["ratio"] is None
    assert cells["a/alpha"]["ratio"] == cells["a/alpha"]["mean"] / cells["a/zeta"]["mean"]
    assert cells["b/mid"]["ratio"] == cells["b/mid"]["mean"] / cells["a/mid"]["mean"]
    # The table marks it too (one set, unlabelled: the scenario's first variant).
    assert _compare(str(a))["baseline"] == "zeta"
    table = cli("compare", str(a), "--metric", "mean_e2el_ms", columns=200).stdout
    assert table.startswith("mean ± std over repeats; (×r) = ratio of means vs zeta")
    # A declared baseline wins; --baseline wins over both.
    declared = _run(tmp_path, "c", {**SCENARIO, "report": {"plots": False, "baseline": "mid"}})
    assert _compare(f"c={declared}", f"a={a}")["baseline"] == "c/mid"
    table = cli("compare", f"c={declared}", f"a={a}", "--metric", "mean_e2el_ms", columns=200).stdout
    title = "ratio of means vs the same variant of the first set (the first set's vs c/mid)"
    assert title in " ".join(table.split()) and table.count("(baseline)") == 1  # the title may wrap
    assert _compare(str(declared))["baseline"] == "mid"
    assert _compare(str(declared), "--baseline", "alpha")["baseline"] == "alpha"


def test_columns_follow_the_scenarios_variant_order(tmp_path):
    a = _run(tmp_path, "a", SCENARIO)
    b = _run(tmp_path, "b", {**SCENARIO, "seed": 1})
    assert list(_compare(str(a))["variants"]) == ["zeta", "alpha", "mid"]
    labelled = list(_compare(f"b={b}", f"a={a}")["variants"])
    assert labelled == ["b/zeta", "b/alpha", "b/mid", "a/zeta", "a/alpha", "a/mid"]
