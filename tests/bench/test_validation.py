"""`disagg-sim validate-cost`: the published points load and quote their
numbers, the command runs on a subset, and docs/validation.md is what the
command wrote (rendered from the stored predictions, which a re-run of the
subset reproduces exactly)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main
from bench.validation.cli import load_results, split
from bench.validation.dataset import INDEPENDENT, load_all, load_points
from bench.validation.fit import load_fitted
from bench.validation.report import render

ROOT = Path(__file__).resolve().parents[2]
# Fast points (about a second each): a closed loop of 4, 1,000 tiny requests, one request of another source.
FAST = [
    "gpustack-qwen3-8b-h100-sharegpt-c4",
    "gpustack-qwen3-14b-h100-random-128",
    "cloudera-qwen2-7b-a100-80gb-kv24g-random-1k1k-n1",
]


def test_the_dataset_has_enough_points_each_quoting_its_numbers():
    points = load_points()
    assert len(points) >= 15
    for p in points:
        assert p.source.url.startswith("https://github.com/") and "/blob/" in p.source.url
        quote = p.source.quote
        pub = p.published
        for line in (
            f"Mean TTFT (ms): {pub.mean_ttft_ms:.2f}",
            f"Mean TPOT (ms): {pub.mean_tpot_ms:.2f}",
            f"Output token throughput (tok/s): {pub.output_throughput:.2f}",
            f"Benchmark duration (s): {pub.duration_s:.2f}",
            f"Total input tokens: {pub.total_input_tokens}",
            f"Total generated tokens: {pub.total_output_tokens}",
        ):
            assert line in quote, (p.id, line)


def test_both_files_load_with_their_sources_and_pd_points_are_listed_not_simulated():
    every = load_all()
    assert len(every) > len(load_points()) and INDEPENDENT.exists()
    assert len({p.lab for p in every}) >= 4
    sim, skipped = split(every)
    assert all(p.pd is None for p in sim)
    pd = [p for p, why in skipped if p.pd is not None]
    assert pd and all(why.startswith("P/D") for p, why in skipped if p.pd is not None)


def test_command_runs_on_a_subset_and_reproduces_the_stored_predictions(tmp_path, capsys):
    out, res = tmp_path / "v.md", tmp_path / "r.json"
    argv = ["validate-cost", "--out", str(out), "--results", str(res)]
    for pid in FAST:
        argv += ["--only", pid]
    assert main(argv) == 0
    fresh = json.loads(res.read_text())
    assert sorted(fresh) == sorted(FAST)
    stored = load_results()
    for pid in FAST:
        assert fresh[pid] == stored[pid], f"{pid}: results.json is stale; regenerate: disagg-sim validate-cost"
    text = out.read_text()
    assert all(f"[{pid}](" in text for pid in FAST)
    assert "Median absolute error" in capsys.readouterr().out


def test_docs_validation_is_the_commands_output():
    doc = (ROOT / "docs" / "validation.md").read_text()
    sim, skipped = split(load_all())
    fitted = load_fitted()
    expected = render(sim, skipped, fitted["in_sample"], fitted["held_out"], load_results())
    assert doc == expected, "regenerate: disagg-sim validate-cost"


def test_every_source_has_its_held_out_fit():
    sim, _ = split(load_all())
    assert {p.lab for p in sim} == set(load_fitted()["held_out"])


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--only", "gpustack-qwen3-8b-h100-sharegpt"], "did you mean"),
        (["--dataset", "no/such.yaml"], "no such file"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, fragment):
    assert main(["validate-cost", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]


def test_the_shipped_gpu_specs_carry_the_fitted_factors():
    """What docs/validation.md validates is what a preset on these GPUs runs."""
    from engine.cost_model import get_cost_model
    from engine.model_shape import get_gpu, shipped_gpus

    fitted = load_fitted()["in_sample"]
    for name in shipped_gpus():
        gpu = get_gpu(name)
        shipped = dict(gpu.efficiency)
        expected = {**fitted.classes.get(gpu.gpu_class, {}), **fitted.host}
        assert shipped == expected, name
    preset = get_cost_model("llama-3.1-8b-h100")
    assert preset.params.compute_efficiency == fitted.classes["hopper"]["compute_efficiency"]
