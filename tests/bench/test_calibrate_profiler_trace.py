"""`calibrate` from a vLLM torch profiler trace (bench/vllm_profiler_trace.py),
and from the per-step sample. The trace sample tests/data/vllm_torch_trace.pt.trace.json is a worker's Chrome
trace in the shape PyTorch's profiler writes it (metadata, CPU ops, runtime
calls, kernels, flow events), its 12 annotated steps timed by a known linear
model (4 ms + 0.05 ms per prefill token + 0.3 ms per decode token + 0.5 ms
per 1000 context tokens) on the GPU stream and shorter on the CPU thread,
plus one step with no tokens."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from bench.vllm_profiler_trace import NO_LENGTHS_WARNING, load_torch_trace
from tests.bench.cli_helpers import ROOT, cli

SAMPLE = ROOT / "tests" / "data" / "vllm_torch_trace.pt.trace.json"
TRUE = {"base_ms": 4.0, "prefill_ms_per_token": 0.05, "decode_ms_per_token": 0.3, "context_ms_per_ktoken": 0.5}


def test_detailed_annotations_give_the_whole_step_shape():
    points, warnings = load_torch_trace(SAMPLE)
    assert warnings == [] and len(points) == 12  # the empty step is skipped
    first, seconds = points[0]  # one fresh 2048-token prompt
    assert (first.prefill_tokens, first.decode_tokens, first.batch_size) == (2048, 0, 1)
    assert (first.context_tokens, first.decode_context_tokens) == (2048, 0)
    assert first.prefill_attention_pairs == 2048 * 2049 // 2
    assert seconds == pytest.approx((4.0 + 0.05 * 2048 + 0.5 * 2.048) / 1000, abs=1e-9)  # the GPU span
    mixed, _ = points[2]  # 1024 new tokens after 512 cached, and two rows decoding at 700 and 900
    assert (mixed.prefill_tokens, mixed.decode_tokens, mixed.batch_size) == (1024, 2, 3)
    assert mixed.prefill_attention_pairs == 1024 * 512 + 1024 * 1025 // 2
    assert (mixed.decode_context_tokens, mixed.context_tokens) == (701 + 901, 1536 + 701 + 901)


def test_calibrate_reads_the_trace_from_the_cli_and_recovers_the_model(tmp_path):
    out = tmp_path / "fit.json"
    done = cli("calibrate", str(SAMPLE), "--out", str(out))  # the format found from the name
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fitted linear cost model on 12 points: median |error| 0.00 %")
    assert done.stderr == ""
    fitted = json.loads(out.read_text())
    for key, value in TRUE.items():
        assert fitted[key] == pytest.approx(value, rel=1e-4), key


def test_a_gzipped_trace_and_a_plain_json_name_fit_the_same(tmp_path):
    gz = tmp_path / "VLLM_Worker_TP0.1764770000000000000.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    plain = tmp_path / "trace.json"  # found by its content
    plain.write_bytes(SAMPLE.read_bytes())
    fits = []
    for source in (gz, plain):
        out = tmp_path / f"{source.name}.fit.json"
        done = cli("calibrate", str(source), "--out", str(out))
        assert done.returncode == 0, done.stderr
        fits.append(json.loads(out.read_text()) | {"name": None})
    ref = tmp_path / "ref.json"
    assert cli("calibrate", str(SAMPLE), "--format", "torch-trace", "--out", str(ref)).returncode == 0
    assert fits == [json.loads(ref.read_text()) | {"name": None}] * 2


def test_default_annotations_fit_with_a_warning_that_context_is_unknown(tmp_path):
    text = re.sub(
        r"execute_\d+_context_(\d+)\(sq(\d+)sk\d+sqsq\d+sqsk\d+\)_generation_(\d+)\(sq(\d+)sk\d+sqsq\d+sqsk\d+\)",
        r"execute_context_\1(\2)_generation_\3(\4)",
        SAMPLE.read_text(),
    )
    trace = tmp_path / "simple.pt.trace.json"
    trace.write_text(text)
    points, warnings = load_torch_trace(trace)
    assert warnings == [NO_LENGTHS_WARNING]
    assert [(s.decode_context_tokens, s.context_tokens) for s, _ in points[:2]] == [(0, 2048), (0, 812)]
    assert points[1][0].prefill_attention_pairs == 2 * 406 * 407 // 2  # two prompts of 812 / 2 tokens
    done = cli("calibrate", str(trace), "--out", str(tmp_path / "fit.json"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == f"warning: {NO_LENGTHS_WARNING}"


def test_a_trace_without_step_annotations_is_one_line_exit_2(tmp_path):
    trace = tmp_path / "cpu_only.pt.trace.json"
    events = [e for e in json.loads(SAMPLE.read_text())["traceEvents"] if "annotation" not in e.get("cat", "")]
    trace.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    done = cli("calibrate", str(trace), "--out", str(tmp_path / "f.json"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"error: {trace}: {len(events)} trace events, none an `execute_context_…_generation_…` step annotation; "
        "allowed: a trace of a vLLM v1 worker profiled while it served requests\n"
    )
    done = cli("calibrate", str(tmp_path), "--format", "torch-trace", "--out", str(tmp_path / "f.json"))
    assert done.returncode == 2 and done.stderr.startswith(f"error: {tmp_path}: is a directory; allowed: a torch")


def test_the_per_step_sample_fits_the_model_it_was_run_with(tmp_path):
    """tests/data/steps_sample.jsonl: every 8th step of an in-process run with
    the linear model 5 ms + 0.08 ms/prefill token + 0.3 ms/decode token +
    0.05 ms/1000 context tokens (tests/bench/test_calibrate.py's scenario)."""
    out = tmp_path / "fit.json"
    sample = ROOT / "tests" / "data" / "steps_sample.jsonl"
    done = cli("calibrate", str(sample), "--node", "decode-0", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fitted linear cost model on 26 points: median |error| 0.00 %, max 0.00 %")
    fitted = json.loads(out.read_text())
    truth = {"base_ms": 5.0, "prefill_ms_per_token": 0.08, "decode_ms_per_token": 0.3, "context_ms_per_ktoken": 0.05}
    assert {k: round(fitted[k], 9) for k in truth} == truth


def test_steps_without_a_gpu_span_are_left_out_and_said_so(tmp_path):
    doc = json.loads(SAMPLE.read_text())
    gpu = [i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "gpu_user_annotation"]
    del doc["traceEvents"][gpu[1]]  # the first step with tokens
    doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "execute_model", "ts": 1.0, "dur": 9.0})
    trace = tmp_path / "partial.pt.trace.json"
    trace.write_text(json.dumps(doc))
    points, warnings = load_torch_trace(trace)
    assert len(points) == 11 and points[0][0].prefill_tokens == 812  # the 2048-token prefill is gone
    assert warnings == [
        "1 of 13 annotated steps have no GPU span in the trace; fitted on the GPU spans only "
        "(CPU spans of the others would not be comparable)"
    ]
    done = cli("calibrate", str(trace), "--out", str(tmp_path / "fit.json"))
    assert done.returncode == 0 and done.stderr.splitlines()[0] == f"warning: {warnings[0]}"
