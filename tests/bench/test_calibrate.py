"""`disagg-sim calibrate` recovers the coefficients the simulator's steps were
generated with, from its own per-step trace and from a bench-serve-style JSON,
and writes a preset file a scenario can name."""

import json

import pytest

from bench.calibrate import fit_linear, fit_roofline, load_bench_serve
from bench.cli import main
from cluster.spec import ClusterSpec
from engine.cost_model import CostModel, StepShape, get_cost_model

TRUE_ROOFLINE = {
    "model": "llama-3.1-8b",
    "gpu": "h100-sxm",
    "host_overhead_ms": 2.0,
    "compute_efficiency": 0.4,
    "attention_efficiency": 0.25,
    "memory_efficiency": 0.7,
}
TRUE_LINEAR = {"base_ms": 5.0, "prefill_ms_per_token": 0.08, "decode_ms_per_token": 0.3, "context_ms_per_ktoken": 0.05}


def _scenario(tmp_path, cost_model: dict):
    doc = {
        "name": "calib-data",
        "runtime": "inproc",
        "cluster": {
            "prefill": {"count": 0},
            "decode": {
                "engine": {
                    "num_gpu_blocks": 4000,
                    "max_num_seqs": 64,
                    "max_num_batched_tokens": 4096,
                    "max_model_len": 16384,
                }
            },
            "cost_model": cost_model,
        },
        "workload": {
            "num_requests": 24,
            "prompt_len": {"kind": "uniform", "low": 200, "high": 12000},
            "output_len": 64,
            "arrival": {"kind": "poisson", "rate": 4},
        },
        "repeats": 1,
        "report": {"plots": False},
    }
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(doc))
    return path


def _steps(tmp_path, cost_model: dict):
    out = tmp_path / "run"
    assert main(["run", str(_scenario(tmp_path, cost_model)), "--out", str(out)]) == 0
    return out / "calib-data__default__r0.steps.jsonl"


@pytest.mark.parametrize("kind", ["linear", "roofline"])
def test_recovers_known_coefficients_from_simulated_steps(tmp_path, kind, capsys):
    truth = TRUE_LINEAR if kind == "linear" else TRUE_ROOFLINE
    steps = _steps(tmp_path, truth)
    preset = tmp_path / "fitted.json"
    argv = ["calibrate", str(steps), "--kind", kind, "--out", str(preset)]
    if kind == "roofline":
        argv += ["--preset", "llama-3.1-8b-h100"]  # starts from the shipped factors
    assert main(argv) == 0
    fitted = json.loads(preset.read_text())
    for key, value in truth.items():
        if isinstance(value, float):
            assert fitted[key] == pytest.approx(value, rel=0.02), key
    # The file is a preset a scenario names.
    spec = ClusterSpec.model_validate({"cost_model": str(preset)})
    model = spec.cost()
    assert model.name == "fitted"
    shape = StepShape(
        prefill_tokens=512,
        decode_tokens=8,
        context_tokens=4000,
        batch_size=9,
        decode_context_tokens=3000,
        prefill_attention_pairs=131328,
    )
    assert model.step_time(shape) == pytest.approx(get_cost_model(truth).step_time(shape), rel=0.02)


def test_bench_serve_json_points_recover_the_model(tmp_path):
    # A vllm bench serve results JSON at concurrency 1: each TTFT is one
    # prefill step, each ITL one decode step of one sequence.
    truth = get_cost_model(TRUE_LINEAR)
    ins = [128, 512, 1024, 2048, 4096, 300]
    outs = [64, 128, 32, 256, 64, 100]
    ctx = int(sum(i + o / 2 for i, o in zip(ins, outs)) / len(ins))
    data = {
        "max_concurrency": 1,
        "input_lens": ins,
        "output_lens": outs,
        "ttfts": [truth.step_time(StepShape(n, 0, n, 1, 0, n * (n + 1) // 2)) for n in ins],
        "itls": [[truth.step_time(StepShape(0, 1, ctx, 1, ctx, 0))] * (o - 1) for o in outs],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    points = load_bench_serve(path)
    fitted = fit_linear(points)
    assert fitted.prefill_ms_per_token == pytest.approx(0.08, rel=0.02)
    for shape, t in points:
        assert fitted.step_time(shape) == pytest.approx(t, rel=0.02)


def test_linear_fit_is_exact_on_exact_data():
    truth = CostModel("t", 3.0, 0.1, 0.2, 0.5)
    shapes = [StepShape(p, d, c, d + (p > 0)) for p in (0, 100, 2000) for d in (1, 16, 64) for c in (100, 5000, 40000)]
    fitted = fit_linear([(s, truth.step_time(s)) for s in shapes])
    for key in ("base_ms", "prefill_ms_per_token", "decode_ms_per_token", "context_ms_per_ktoken"):
        assert getattr(fitted, key) == pytest.approx(getattr(truth, key), rel=1e-6)


def test_roofline_fit_from_shapes():
    truth = get_cost_model(TRUE_ROOFLINE)
    shapes = [StepShape(n, 0, n, 1, 0, n * (n + 1) // 2) for n in (256, 1024, 4096, 8192)] + [
        StepShape(0, b, b * c, b, b * c, 0) for b in (1, 8, 64, 256) for c in (200, 4000)
    ]
    fitted = fit_roofline([(s, truth.step_time(s)) for s in shapes], get_cost_model("llama-3.1-8b-h100"))
    for key in ("host_overhead_ms", "compute_efficiency", "attention_efficiency", "memory_efficiency"):
        assert getattr(fitted.params, key) == pytest.approx(TRUE_ROOFLINE[key], rel=0.02), key


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["calibrate", "nope.jsonl", "--out", "x.json"], "nope.jsonl: no such file"),
        (["calibrate", "{steps}", "--out", "x.txt"], "--out x.txt: allowed: a path ending in .json"),
        (["calibrate", "{steps}", "--kind", "roofline", "--out", "{tmp}/x.json"], "--preset: required"),
        (
            ["calibrate", "{steps}", "--kind", "roofline", "--preset", "unit", "--out", "{tmp}/x.json"],
            "is a linear set",
        ),
        (["calibrate", "{bad}", "--out", "{tmp}/x.json"], "num_decode_tokens is missing"),
    ],
)
def test_bad_calibrate_input_is_one_line_exit_2(tmp_path, capsys, argv, fragment):
    steps = tmp_path / "s.jsonl"
    steps.write_text(
        json.dumps(
            {
                "num_prefill_tokens": 0,
                "num_decode_tokens": 4,
                "batch_size": 4,
                "context_tokens": 40,
                "decode_context_tokens": 40,
                "prefill_attention_pairs": 0,
                "duration": 0.01,
            }
        )
        + "\n"
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"num_prefill_tokens": 0, "duration": 0.01}) + "\n")
    argv = [a.format(steps=steps, bad=bad, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_front_end_terms_come_out_of_a_bench_json(tmp_path, capsys):
    """At concurrency 1 a TTFT is the API server's time plus one prefill step and
    an ITL one decode step plus the streaming of one token: calibrate separates them."""
    engine = get_cost_model("llama-3.1-8b-h100")
    request_s, token_s, out_s = 0.012, 2e-6, 150e-6
    ins = [128, 512, 1024, 2048, 4096, 300]
    outs = [64, 128, 32, 256, 64, 100]
    ctx = int(sum(i + o / 2 for i, o in zip(ins, outs)) / len(ins))
    decode = engine.step_time(StepShape(0, 1, ctx, 1, ctx, 0))
    data = {
        "max_concurrency": 1,
        "input_lens": ins,
        "output_lens": outs,
        "ttfts": [request_s + token_s * n + engine.step_time(StepShape(n, 0, n, 1, 0, n * (n + 1) // 2)) for n in ins],
        "itls": [[decode + out_s] * (o - 1) for o in outs],
    }
    path, preset, fe = tmp_path / "bench.json", tmp_path / "p.json", tmp_path / "fe.json"
    path.write_text(json.dumps(data))
    argv = ["calibrate", str(path), "--kind", "roofline", "--preset", "llama-3.1-8b-h100", "--out", str(preset)]
    assert main([*argv, "--front-end-out", str(fe)]) == 0
    got = json.loads(fe.read_text())
    assert got["request_ms"] == pytest.approx(12.0, rel=1e-3)
    assert got["prompt_token_us"] == pytest.approx(2.0, rel=1e-3)
    assert got["output_token_us"] == pytest.approx(150.0, rel=1e-3)
    # The mapping is a cluster.front_end setting.
    assert ClusterSpec.model_validate({"front_end": got}).front_end.params().request_ms == got["request_ms"]
    assert "use it as cluster.front_end" in capsys.readouterr().out
    # The TTFTs less the front end are the preset's prefill steps: its compute factor comes back.
    fitted = json.loads(preset.read_text())
    assert fitted["compute_efficiency"] == pytest.approx(engine.params.compute_efficiency, rel=0.05)
    with_steps = ["calibrate", str(path), "--kind", "linear", "--out", str(preset), "--front-end-out", str(fe)]
    assert main(with_steps) == 2
