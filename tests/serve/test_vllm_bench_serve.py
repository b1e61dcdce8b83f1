"""`vllm bench serve` (vLLM 0.33.0, from the oracle venv) against `disagg-sim
serve`: a random-dataset benchmark with `--tokenizer` set to the exported
directory completes every request, agrees with the server on every token
count, and sees the TTFT and TPOT the simulator recorded for the same
requests, within the margin docs/serve.md gives (client-side overhead:
HTTP, JSON, the driver waking to the wall clock). On both runtimes: on Ray
the records are the proxy's (it stamps tokens as it hears them from the
decode node), and the server is the front door in the proxy actor."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.serve.tokenizer import get_tokenizer

from .conftest import MODEL
from .oracle import launch

ORACLE_TOOLS_DIR, oracle_env, oracle_missing_reason, oracle_python = (
    launch.ORACLE_TOOLS_DIR,
    launch.oracle_env,
    launch.oracle_missing_reason,
    launch.oracle_python,
)

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 24, 200, 64


# docs/serve.md: what a client may see on top of the simulator's records
# (observed on the 2-core box: TTFT +10..25 ms, TPOT +0.02..0.14 ms).
def ttft_margin_ms(sim_ms: float) -> float:
    return 40.0 + 0.25 * sim_ms


def tpot_margin_ms(sim_ms: float) -> float:
    return 1.0 + 0.10 * sim_ms


def sim_latencies(records) -> tuple[float, float]:
    ttfts = [(r.token_times[0] - r.arrival_time) * 1e3 for r in records]
    tpots = [(r.token_times[-1] - r.token_times[0]) * 1e3 / (len(r.token_times) - 1) for r in records]
    return sum(ttfts) / len(ttfts), sum(tpots) / len(tpots)


def test_vllm_bench_serve_random_dataset(tmp_path, server):
    reason = oracle_missing_reason("v1")
    if reason:
        pytest.skip(f"vllm bench serve comes from the vLLM 0.33.0 oracle venv: {reason}")
    tok_dir = get_tokenizer().export(tmp_path / "tokenizer")
    srv = server  # this module's only test: its records are exactly the benchmark's
    args = [
        str(oracle_python("v1")),
        str(ORACLE_TOOLS_DIR / "bench_serve.py"),
        "--backend", "openai", "--base-url", srv.base_url, "--model", MODEL, "--tokenizer", str(tok_dir),
        "--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(NUM_PROMPTS), "--request-rate", "8", "--seed", "0", "--ignore-eos",
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json",
    ]  # fmt: skip
    out = subprocess.run(args, capture_output=True, text=True, env=oracle_env("v1"), timeout=600)
    sys.stdout.write(out.stdout[-3000:])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tokenizer mismatch" not in out.stdout  # /tokenize agreed with the exported tokenizer
    records = sorted(srv.query("finished"), key=lambda r: r.arrival_time)
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == NUM_PROMPTS and result["failed"] == 0
    assert result["total_input_tokens"] == NUM_PROMPTS * INPUT_LEN
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    runs = records  # (its ready check is off by default: no extra test request)
    assert len(runs) == NUM_PROMPTS
    assert [r.prompt_len for r in runs] == [INPUT_LEN] * NUM_PROMPTS
    assert all(len(r.output_token_ids) == OUTPUT_LEN and r.finish_reason == "length" for r in runs)
    ttft, tpot = sim_latencies(runs)
    client = f"ttft client {result['mean_ttft_ms']:.2f} sim {ttft:.2f}"
    itls = [(b - a) * 1e3 for r in runs for a, b in zip(r.token_times, r.token_times[1:])]
    itl = f"itl client {result['mean_itl_ms']:.3f} sim {sum(itls) / len(itls):.3f}"
    print(f"{client}; tpot client {result['mean_tpot_ms']:.3f} sim {tpot:.3f}; {itl}")
    assert abs(result["mean_ttft_ms"] - ttft) <= ttft_margin_ms(ttft)
    assert abs(result["mean_tpot_ms"] - tpot) <= tpot_margin_ms(tpot)
