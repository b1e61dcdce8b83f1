"""Re-simulate one published point in-process, the way it was run.

The node is one aggregated vLLM v1 engine (no disaggregation: `prefill.count:
0`) with vLLM's defaults for the version and GPU; the workload is the
published one (docs/validation.md, "How each point is re-simulated").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from bench.metrics import compute_metrics
from bench.scenario import Scenario
from engine.roofline import RooflineCostModel, RooflineParams

from .dataset import Point

# vLLM's serving defaults per GPU (vLLM's vllm/engine/arg_utils.py,
# `_set_default_max_num_seqs_and_batched_tokens_args`): a GPU of >= 70 GiB
# that is not an A100 gets 8,192 batched tokens and 1,024 sequences for the
# OpenAI server; every other GPU 2,048 and 256.
SERVER_DEFAULTS = {"h100-sxm": (8192, 1024)}
OTHER_GPUS = (2048, 256)
# ShareGPT as `vllm bench serve` samples it: prompts <= 1,024 tokens and
# prompt + output <= 2,048 (its is_valid_sequence); lengths in between are
# not published per request, only their totals.
SHAREGPT_SIGMA = {"prompt": 1.0, "output": 0.9}
SHAREGPT_MIN, SHAREGPT_MAX = 4, 1024
# vLLM's max_model_len when `--max-model-len` is not given: the model's
# max_position_embeddings (config.json: 40,960 for the Qwen3 dense models,
# 262,144 for Qwen3-235B-A22B-Instruct-2507).
MAX_POSITION_EMBEDDINGS = {"qwen3-8b": 40960, "qwen3-14b": 40960, "qwen3-32b": 40960, "qwen3-235b-a22b": 262144}
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Predicted:
    mean_ttft_ms: float
    mean_tpot_ms: float
    mean_itl_ms: float
    output_throughput: float
    duration_s: float
    num_gpu_blocks: int
    # True when the pool is the start-up bound (one max_model_len request),
    # above our estimate from memory: the published run started, so its pool
    # held at least that much.
    kv_floor: bool
    num_preemptions: int


def _clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """E[clip(exp(N(mu, sigma)), lo, hi)], numerically (a fine grid in log space)."""
    z = np.linspace(-8.0, 8.0, 4001)
    x = np.clip(np.exp(mu + sigma * z), lo, hi)
    w = np.exp(-0.5 * z * z)
    return float((x * w).sum() / w.sum())


def lognormal_with_mean(mean: float, sigma: float, lo: int = SHAREGPT_MIN, hi: int = SHAREGPT_MAX) -> dict:
    """A clipped lognormal length spec whose mean is `mean` (bisection on mu)."""
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        mid = (a + b) / 2
        if _clipped_lognormal_mean(mid, sigma, lo, hi) < mean:
            a = mid
        else:
            b = mid
    return {"kind": "lognormal", "mu": round((a + b) / 2, 6), "sigma": sigma, "min": lo, "max": hi}


def workload_for(point: Point) -> dict:
    """The published workload: random lengths at the published means (the
    random dataset's lengths are fixed; `Total input/generated tokens` give the
    exact means, which also carry early EOS), or ShareGPT-shaped lengths with
    the published means; all requests at once (request rate inf) or closed
    loop at `max_concurrency`."""
    if point.dataset == "random":
        prompt: dict | int = max(1, round(point.mean_input_len))
        output: dict | int = max(1, round(point.mean_output_len))
    else:
        prompt = lognormal_with_mean(point.mean_input_len, SHAREGPT_SIGMA["prompt"])
        output = lognormal_with_mean(point.mean_output_len, SHAREGPT_SIGMA["output"])
    arrival = (
        {"kind": "all_at_once"} if point.request_rate == "inf" else {"kind": "poisson", "rate": point.request_rate}
    )
    wl = {"num_requests": point.num_prompts, "prompt_len": prompt, "output_len": output, "arrival": arrival}
    if point.max_concurrency is not None:
        wl["max_concurrency"] = point.max_concurrency
    return wl


def vllm_max_model_len(point: Point) -> int:
    """`--max-model-len` of the serve command, else the model's maximum."""
    m = re.search(r"--max[-_]model[-_]len[ =](\d+)", point.serve)
    return int(m.group(1)) if m else MAX_POSITION_EMBEDDINGS[point.model]


def kv_pool(point: Point, params: RooflineParams) -> tuple[int, bool]:
    """KV blocks as vLLM sizes them (engine/roofline.py's estimate, 0.9 of the
    memory), raised to one max_model_len request when the estimate is below
    it: vLLM refuses to start otherwise, and every published run started."""
    tokens, seqs = SERVER_DEFAULTS.get(point.gpu, OTHER_GPUS)
    model = RooflineCostModel.from_dict({"model": point.model, "gpu": point.gpu, "tp": point.tp, **vars(params)})
    try:
        estimate = model.num_gpu_blocks(0.9, BLOCK_SIZE, tokens, seqs)
    except ValueError:
        estimate = 0
    floor = -(-vllm_max_model_len(point) // BLOCK_SIZE)
    return max(estimate, floor), estimate < floor


def scenario_for(point: Point, params: RooflineParams, seed: int = 0) -> dict:
    """The scenario document that re-runs `point` with the roofline `params`."""
    tokens, seqs = SERVER_DEFAULTS.get(point.gpu, OTHER_GPUS)
    wl = workload_for(point)
    blocks, _ = kv_pool(point, params)
    engine = {
        "num_gpu_blocks": blocks,
        "gpu_memory_utilization": 0.9,
        "max_num_batched_tokens": tokens,
        "max_num_seqs": seqs,
        "max_model_len": vllm_max_model_len(point),
        "enable_prefix_caching": point.prefix_caching,
        "async_scheduling": False,
    }
    cost = {"name": point.id, "model": point.model, "gpu": point.gpu, "tp": point.tp, **vars(params)}
    return {
        "name": f"validate-{point.id}"[:100],
        "runtime": "inproc",
        "seed": seed,
        "cluster": {
            "prefill": {"count": 0},
            "decode": {"count": 1, "engine": engine},
            "cost_model": cost,
            # The shadow KV store checks block contents; it changes no timing and costs a third of the run.
            "shadow_kv": False,
        },
        "workload": wl,
        "variants": [{"name": "published"}],
        "repeats": 1,
    }


def simulate(point: Point, params: RooflineParams | None = None, seed: int = 0) -> Predicted:
    """Run `point` once in-process (virtual clock) and return vllm bench serve's means."""
    params = params or RooflineParams()
    scenario = Scenario(scenario_for(point, params, seed), source=f"bench/validation/published.yaml#{point.id}")
    # Imported here: the runner pulls in the plots (matplotlib), which every
    # `disagg-sim` command would otherwise load to build its parser.
    from bench.sweep import run_one

    run = run_one(scenario, "published", 0, "inproc")
    m = compute_metrics(run.requests).to_dict()
    blocks, floor = kv_pool(point, params)
    return Predicted(
        mean_ttft_ms=float(m["mean_ttft_ms"]),
        mean_tpot_ms=float(m["mean_tpot_ms"]),
        mean_itl_ms=float(m["mean_itl_ms"]),
        output_throughput=float(m["output_throughput"]),
        duration_s=float(m["duration"]),
        num_gpu_blocks=int(blocks),
        kv_floor=floor,
        num_preemptions=int(run.counters().get("num_preemptions", 0)),
    )
