"""Re-simulate one published point in-process, the way it was run.

Aggregated points run vLLM v1 engines without disaggregation (`prefill.count:
0`; `replicas` of them behind the router); P/D points run the published
prefill and decode pools behind the proxy, with the P/D timeline of the
connector the source used (`cluster.kv_transfer`, cluster/kv_transfer.py).
Both with vLLM's defaults for the version and GPU and the serve command's
flags; the workload is the published one; the API server
(engine/front_end.py) is applied to the finished run by
bench/validation/front_end_replay.py (docs/validation.md, "How each point is
re-simulated").
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np

from bench.metrics import compute_metrics
from bench.scenario import Scenario
from cluster.kv_transfer import PRESETS
from engine.front_end import FrontEndParams
from engine.model_shape import get_gpu, shipped_gpus, shipped_models
from engine.roofline import RooflineCostModel, RooflineParams

from .dataset import Point
from .front_end_replay import Emissions, emissions_of, replay

# vLLM's serving defaults per GPU (vllm/engine/arg_utils.py,
# `_set_default_max_num_seqs_and_batched_tokens_args`): a GPU of >= 70 GiB
# that is not an A100 gets 8,192 batched tokens and 1,024 sequences for the
# OpenAI server; every other GPU 2,048 and 256.
BIG_GPU_DEFAULTS = (8192, 1024)
OTHER_GPUS = (2048, 256)
# ShareGPT as `vllm bench serve` samples it: prompts <= 1,024 tokens and
# prompt + output <= 2,048 (its is_valid_sequence); lengths in between are
# not published per request, only their totals.
SHAREGPT_SIGMA = {"prompt": 1.0, "output": 0.9}
SHAREGPT_MIN, SHAREGPT_MAX = 4, 1024
# vLLM's max_model_len when `--max-model-len` is not given: the model's
# max_position_embeddings (config.json).
MAX_POSITION_EMBEDDINGS = {
    "qwen3-8b": 40960,
    "qwen3-14b": 40960,
    "qwen3-32b": 40960,
    "qwen3-30b-a3b": 40960,
    "qwen3-235b-a22b": 262144,
    "llama-3.1-8b": 131072,
    "llama-3.1-70b": 131072,
    "qwen2-7b": 32768,
    "gpt-oss-20b": 131072,
    "gpt-oss-120b": 131072,
}
BLOCK_SIZE = 16
# The first vLLM release whose engine schedules asynchronously by default.
ASYNC_SCHEDULING_SINCE = (0, 14)
# The connector a P/D point's source ran -> the `cluster.kv_transfer` preset
# of the same connector (docs/cost-model.md, "The P/D hand-off").
CONNECTOR_PRESETS = {"nixl": "nixl", "p2pnccl": "p2pnccl", "mooncake": "mooncake"}
# A P/D hand-off must not time out in a validation run: vLLM's NIXL
# connector aborts a held request only after VLLM_NIXL_ABORT_REQUEST_TIMEOUT
# (480 s), and the published runs completed every request.
PD_PULL_TIMEOUT_S = 480.0


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


def skip_reason(point: Point) -> str | None:
    """Why a point is not re-simulated (yet), or None."""
    if point.pd is not None and point.pd.get("connector") not in CONNECTOR_PRESETS:
        connector = point.pd.get("connector")
        return f"P/D connector {connector!r} has no kv_transfer preset; allowed: {sorted(CONNECTOR_PRESETS)}"
    if point.model not in shipped_models():
        return f"model {point.model} not in engine/data/models.json"
    if point.gpu not in shipped_gpus():
        return f"gpu {point.gpu} not in engine/data/gpus.json"
    if point.model not in MAX_POSITION_EMBEDDINGS:
        return f"model {point.model}: max_position_embeddings not recorded"
    return None


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
    arrival: dict
    if point.request_rate == "inf":
        arrival = {"kind": "all_at_once"}
    elif point.burstiness is not None and point.burstiness != 1:
        arrival = {"kind": "gamma", "rate": point.request_rate, "burstiness": point.burstiness}
    else:
        arrival = {"kind": "poisson", "rate": point.request_rate}
    wl = {"num_requests": point.num_prompts, "prompt_len": prompt, "output_len": output, "arrival": arrival}
    if point.max_concurrency is not None:
        wl["max_concurrency"] = point.max_concurrency
    return wl


def _flag(point: Point, name: str) -> str | None:
    m = re.search(rf"--{name}[ =]([^\s)]+)", point.serve.replace("_", "-"))
    return m.group(1) if m else None


def vllm_max_model_len(point: Point) -> int:
    """`--max-model-len` of the serve command (or max_model_len= of a launcher), else the model's maximum."""
    m = re.search(r"max[-_]model[-_]len[ =](\d+)", point.serve)
    return int(m.group(1)) if m else MAX_POSITION_EMBEDDINGS[point.model]


def server_defaults(point: Point) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of `vllm serve` on this GPU."""
    gpu = get_gpu(point.gpu)
    big = gpu.memory_GB * 1e9 >= 70 * 2**30 and not point.gpu.startswith("a100")
    return BIG_GPU_DEFAULTS if big else OTHER_GPUS


def block_size(point: Point) -> int:
    """`--block-size` of the serve command, else vLLM's default (16)."""
    v = _flag(point, "block-size")
    return int(v) if v and v.isdigit() else BLOCK_SIZE


def memory_utilization(point: Point) -> float:
    v = _flag(point, "gpu-memory-utilization")
    return float(v) if v else 0.9


def cost_dict(point: Point, params: RooflineParams) -> dict:
    """The roofline cost model of the point: its model, GPU, parallelism and dtypes."""
    quant = (point.quantization or "").lower()
    dtype = "mxfp4" if quant.startswith("mxfp4") else "fp8" if quant.startswith("fp8") else "auto"
    kv = "fp8" if (_flag(point, "kv-cache-dtype") or "").startswith("fp8") else "auto"
    return {
        "name": point.id,
        "model": point.model,
        "gpu": point.gpu,
        "tp": point.tp,
        "pp": point.pp,
        "dtype": dtype,
        "kv_cache_dtype": kv,
        **asdict(params),
        "host_overlap": 1.0 if async_scheduling(point) else 0.0,
    }


def async_scheduling(point: Point) -> bool:
    """Whether the run's engine scheduled asynchronously: the point's `async_scheduling` if set, else vLLM's
    default for its version, on from 0.14.0 (vllm/config/vllm.py: unless pp > 1; docs/cost-model.md, "Host
    time"); a version without a number (an unnamed main or image) is taken as older unless the point says."""
    if point.async_scheduling is not None:
        return point.async_scheduling
    m = re.search(r"(\d+)\.(\d+)", point.vllm_version)
    if m is None:
        return False
    return (int(m.group(1)), int(m.group(2))) >= ASYNC_SCHEDULING_SINCE and point.pp == 1


def kv_pool(point: Point, params: RooflineParams) -> tuple[int, bool]:
    """KV blocks as vLLM sizes them (engine/roofline.py's estimate), raised to
    one max_model_len request when the estimate is below it: vLLM refuses to
    start otherwise, and every published run started."""
    tokens, seqs = server_defaults(point)
    model = RooflineCostModel.from_dict(cost_dict(point, params))
    try:
        estimate = model.num_gpu_blocks(memory_utilization(point), block_size(point), tokens, seqs)
    except ValueError:
        estimate = 0
    floor = -(-vllm_max_model_len(point) // block_size(point))
    return max(estimate, floor), estimate < floor


def kv_transfer_for(point: Point) -> dict:
    """The P/D hand-off of a P/D point: the preset of the connector its
    source ran, with the TP layouts as served. The handshake is made before
    the measured run: `vllm bench serve` sends one test prompt through the
    whole path first ("Starting initial single prompt test run"), the first
    contact of a 1P1D pair (docs/validation.md, "How each point is
    re-simulated"). Where the source measured its fabric
    (`pd.bandwidth_GBps`), that bandwidth is the wire's (kv_link_for) and
    the connector keeps the preset's other terms, not its bandwidth: the
    documented way to switch a preset's bandwidth off is `preset: none`
    with the terms set (docs/cost-model.md, "The P/D hand-off")."""
    pd = point.pd or {}
    preset = CONNECTOR_PRESETS[pd["connector"]]
    kv: dict = {"preset": preset}
    if pd.get("bandwidth_GBps"):
        kv = {"preset": "none", **{k: v for k, v in PRESETS[preset].items() if k != "bandwidth_GBps"}}
    kv.update(
        {
            "handshake_s": 0.0,
            "prefill_tp": int(pd.get("prefill_tp") or point.tp),
            "decode_tp": int(pd.get("decode_tp") or point.tp),
        }
    )
    return kv


def kv_link_for(point: Point) -> dict:
    """The KV wire between a decode and a prefill node: the fabric bandwidth
    the source measured, if it did. One FIFO wire per (decode, prefill) pair
    (connector/link.py): concurrent transfers share it, as they share the
    NICs; unmeasured fabrics are left to the connector preset."""
    bandwidth = (point.pd or {}).get("bandwidth_GBps")
    return {"bandwidth_MBps": float(bandwidth) * 1000.0} if bandwidth else {}


def scenario_for(point: Point, params: RooflineParams, seed: int = 0) -> dict:
    """The scenario document that re-runs `point` with the roofline `params`."""
    tokens, seqs = server_defaults(point)
    wl = workload_for(point)
    blocks, _ = kv_pool(point, params)
    engine = {
        "block_size": block_size(point),
        "num_gpu_blocks": blocks,
        "gpu_memory_utilization": memory_utilization(point),
        "max_num_batched_tokens": tokens,
        "max_num_seqs": seqs,
        "max_model_len": vllm_max_model_len(point),
        "enable_prefix_caching": point.prefix_caching,
        "async_scheduling": False,
    }
    cluster: dict = {
        "prefill": {"count": 0},
        "decode": {"count": point.replicas, "engine": engine, "pp_size": point.pp},
        "cost_model": cost_dict(point, params),
        "routing": "round_robin",
        # The API server is applied after the run (front_end_replay.py), on
        # the engine-side timeline, so one run serves every front-end trial.
        "front_end": {"preset": "off"},
        # The shadow KV store checks block contents; it changes no timing and costs a third of the run.
        "shadow_kv": False,
    }
    if point.pd is not None:
        pd = point.pd
        cluster.update(
            {
                "prefill": {"count": int(pd["num_prefill"]), "engine": engine, "pp_size": point.pp},
                "decode": {"count": int(pd["num_decode"]), "engine": engine, "pp_size": point.pp},
                "kv_transfer": kv_transfer_for(point),
                "links": {"kv": kv_link_for(point)},
                # The hand-off carries the model's real K/V (bytes per token of the cost model).
                "bytes_per_token": "auto",
                "kv_pull_timeout_s": PD_PULL_TIMEOUT_S,
                "kv_pull_deadline_s": PD_PULL_TIMEOUT_S,
            }
        )
    return {
        "name": f"validate-{point.id}"[:100],
        "runtime": "inproc",
        "seed": seed,
        "cluster": cluster,
        "workload": wl,
        "variants": [{"name": "published"}],
        "repeats": 1,
    }


@dataclass(frozen=True)
class EngineRun:
    """What a run of the engines gives the front-end replay: the workload and each request's emissions."""

    workload: tuple
    max_concurrency: int | None
    emissions: dict[str, Emissions]
    num_gpu_blocks: int
    kv_floor: bool
    num_preemptions: int
    # API servers in front (one per replica: each engine instance runs its own `vllm serve`)
    servers: int = 1


def run_engines(point: Point, params: RooflineParams, seed: int = 0, within=None) -> EngineRun:
    """Run `point`'s engines once in-process (virtual clock), the front end off
    (`within`: progress as requests finish, as `run_one` takes it)."""
    scenario = Scenario(scenario_for(point, params, seed), source=f"bench/validation#{point.id}")
    # Imported here: the runner pulls in the plots (matplotlib), which every
    # `disagg-sim` command would otherwise load to build its parser.
    from bench.sweep import run_one

    run = run_one(scenario, "published", 0, "inproc", within=within)
    workload, max_concurrency = scenario.workload("published", seed)
    emissions = {e.request_id: e for e in (emissions_of(r) for r in run.requests) if e is not None}
    blocks, floor = kv_pool(point, params)
    return EngineRun(
        tuple(workload),
        max_concurrency,
        emissions,
        blocks,
        floor,
        int(run.counters().get("num_preemptions", 0)),
        servers=api_servers(point),
    )


def api_servers(point: Point) -> int:
    """The API servers that stream a point's tokens: one per engine instance that serves the client (each runs
    its own `vllm serve`), so the aggregated replicas or, in P/D, the decode nodes (round robin, as routed)."""
    return int(point.pd["num_decode"]) if point.pd is not None else point.replicas


def predict_from(run: EngineRun, front_end: FrontEndParams) -> Predicted:
    """vllm bench serve's means as the client sees them, through the API server."""
    records = replay(run.workload, run.emissions, front_end, run.max_concurrency, run.servers)
    m = compute_metrics(records).to_dict()
    return Predicted(
        mean_ttft_ms=float(m["mean_ttft_ms"]),
        mean_tpot_ms=float(m["mean_tpot_ms"]),
        mean_itl_ms=float(m["mean_itl_ms"]),
        output_throughput=float(m["output_throughput"]),
        duration_s=float(m["duration"]),
        num_gpu_blocks=run.num_gpu_blocks,
        kv_floor=run.kv_floor,
        num_preemptions=run.num_preemptions,
    )


def simulate(
    point: Point, params: RooflineParams | None = None, front_end: FrontEndParams | None = None, seed: int = 0
) -> Predicted:
    """Run `point` once and return vllm bench serve's means (front end off unless given)."""
    return predict_from(run_engines(point, params or RooflineParams(), seed), front_end or FrontEndParams())
