"""From the CLI: `calibrate` reads what real hardware produces — a vLLM
server log's stats lines, a `vllm bench serve --save-detailed` JSON (samples
in tests/data) — and warns when a fitted factor sits on a bound or the data
cannot identify it."""

from __future__ import annotations

import json

from bench.vllm_log_stats import load_vllm_log
from tests.bench.cli_helpers import ROOT, cli

DATA = ROOT / "tests" / "data"


def _warnings(stderr: str) -> list[str]:
    return [line.split(" ", 2)[1] for line in stderr.splitlines() if line.startswith("warning: ")]


def test_vllm_log_gives_one_decode_step_per_decode_only_interval():
    points = load_vllm_log(DATA / "vllm_server.log")
    # 10 stats lines: one idle, one that also prefilled, eight decode-only.
    assert [s.decode_tokens for s, _ in points] == [1, 2, 4, 8, 16, 32, 64, 128]
    shape, seconds = points[2]
    assert (shape.prefill_tokens, shape.batch_size) == (0, 4)
    assert shape.context_tokens == round(0.013 * 470_000)  # GPU KV cache usage 1.3 % of 470,000 tokens
    line = [x for x in (DATA / "vllm_server.log").read_text().splitlines() if "Running: 4 reqs" in x][-1]
    generation = float(line.split("Avg generation throughput: ")[1].split(" ")[0])
    assert seconds == 4 / generation  # four sequences, one token each per step


def test_calibrate_from_a_vllm_log_fits_decode_and_says_what_it_cannot(tmp_path):
    out = tmp_path / "fit.json"
    done = cli("calibrate", str(DATA / "vllm_server.log"), "--kind", "roofline", "--preset", "llama-3.1-8b-h100",
               "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fitted roofline cost model on 8 points: median |error| ")
    # Decode-only steps: nothing compute-bound, no prefill attention. And the
    # preset's per-sequence host time (80 us, fitted on published vLLM runs;
    # calibrate keeps it) leaves this sample's large decode batches less
    # time than reading the K/V at the peak takes: kv_memory_efficiency (the
    # decode steps' K/V reads, most of their bytes at these contexts) is
    # pinned at its bound, and the fit says so; what is left moves every step
    # in proportion, so the weight reads and the per-step host time are one
    # combination (the warning names both).
    assert _warnings(done.stderr) == [
        "kv_memory_efficiency",
        "compute_efficiency",
        "attention_efficiency",
        "memory_efficiency",
    ]
    assert "not identifiable from these points" in done.stderr and "sits on its bound 1.0" in done.stderr
    assert json.loads(out.read_text())["kv_memory_efficiency"] == 1.0


def test_concurrency_1_bench_serve_warns_of_factors_on_their_bound(tmp_path):
    done = cli("calibrate", str(DATA / "vllm_bench_serve_c1.json"), "--kind", "roofline", "--preset",
               "llama-3.1-8b-h100", "--out", str(tmp_path / "fit.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "warning: memory_efficiency sits on its bound 1.0: the data want the hardware faster than its peak" in (
        "\n".join(lines)
    )
    # On a bound: the weight reads and the K/V reads (from the preset of the 2026-12-07 refit; attention and the
    # weight reads from the one before); attention and the K/V reads are not identifiable (prefills of one size
    # range, decode of one request at a time).
    assert _warnings(done.stderr) == [
        "memory_efficiency",
        "kv_memory_efficiency",
        "attention_efficiency",
        "kv_memory_efficiency",
    ]


def test_a_log_without_decode_intervals_is_one_line_exit_2(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "INFO GPU KV cache size: 1,000 tokens\n"
        "INFO Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 5.0 tokens/s, "
        "Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%\n"
    )
    done = cli("calibrate", str(log), "--out", str(tmp_path / "f.json"))
    assert done.returncode == 2
    assert done.stderr == (
        f"error: {log}: 1 stats line(s), none of a decode-only interval (prompt throughput 0, generation > 0, "
        "requests running); allowed: a log of a run that decoded for at least one interval\n"
    )
    log.write_text("INFO nothing here\n")
    done = cli("calibrate", str(log), "--out", str(tmp_path / "f.json"))
    assert done.returncode == 2 and "no 'GPU KV cache size: N tokens' line" in done.stderr
