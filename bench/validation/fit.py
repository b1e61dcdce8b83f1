"""Fit the few parameters the validation needs, on a set of points, and keep
them in fitted.json (docs/validation.md, "How the parameters were fitted").

What is fitted, and on which points of the set:
- per GPU class (hopper, ampere, ...: engine/data/gpus.json `gpu_class`):
  `compute_efficiency` (dense GEMMs; attention kept at the defaults' ratio
  to it), `moe_compute_efficiency` (the MoE experts' grouped GEMMs, where a
  MoE point identifies it) and `kv_memory_efficiency` (decode attention's
  paged K/V reads), on the
  engine-bound points of that class (random prompts of >= 1,000 tokens, all
  at once or at least 16 in flight);
- `host_per_seq_us` (the step's host time per scheduled sequence), on the
  points with >= 64 requests in flight (batches of tens to hundreds of rows;
  until 2026-12-07 only those of >= 500 at once, GPUStack's alone);
- the fixed times of a step of a few rows, on the points with at most 16
  requests in flight, and the weight reads that dominate such a step:
  `memory_efficiency` (one value for every class: the share of peak
  bandwidth a GEMM streaming its weights reaches), `host_overhead_ms` (the
  step's host time),
  `moe_layer_us` (one MoE layer's routing and dispatch) where a MoE point is
  among them; a term no such point identifies keeps its cited value
  (START_LAYERS), and `collective_latency_us` (one TP all-reduce, two per
  layer) always does (a measurement of the kernel itself, identified_terms).
  `--fit-fixed` refits only these, from the stored fit; `--fit-layers` only
  the MoE layer's (then only MoE points' runs change, relevant_params);
- the API server's `request_ms`, `output_token_us` and `ipc_ms`
  (engine/front_end.py), on the points whose replay is cheap (<= 30,000
  output tokens).
`prompt_token_us` keeps its cited value. A source whose TTFT does not
measure what the model predicts (TTFT_NOT_FITTED) leaves its TTFT out.
P/D points take part in no fit: their hand-off terms are the connector
presets' cited values (cluster/kv_transfer.py), and the points check the
P/D timeline with what the aggregated points fitted.

Why so few: leave-one-source-out (cli.py) refits them without the held-out
source, and a point's error then says how the model generalises, which
per-point knobs could not. The engine-side groups (class factors, host per
row, small steps' terms) are walked twice from the defaults in-sample; a
held-out fit walks them once from the in-sample values its points identify
(`warm_start`). The search: for each parameter group a walk
along its grid from the starting value to the neighbour that scores lower,
until none does; score = sum of squared log errors of the metrics a point
publishes (mean TTFT, mean TPOT, output throughput).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from engine.front_end import FrontEndParams, checked_front_end
from engine.model_shape import get_gpu, get_model
from engine.roofline import RooflineParams

from .dataset import Point
from .roles import gpu_class, is_cheap_replay, is_engine_bound, is_large_batch, is_low_load
from .simulate import EngineRun, Predicted, predict_from, run_engines

FITTED = Path(__file__).resolve().parent / "fitted.json"
METRIC_KEYS = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")
COMPUTE_GRID = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8)
MEMORY_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ENGINE_ROUNDS = 2
# Weight reads: the walk on the low-load points, finer near the top where GEMVs stream.
WEIGHT_MEMORY_GRID = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
HOST_PER_SEQ_GRID = (0.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
HOST_OVERHEAD_GRID = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MOE_LAYER_US_GRID = (0.0, 10.0, 20.0, 30.0, 45.0, 60.0, 80.0, 100.0, 130.0)
# The per-layer fixed times where the fit starts, and what a fit whose points
# do not identify them keeps (docs/cost-model.md, "Fixed times per layer"):
# vLLM's custom all-reduce of 0.5-32 KB on H100 at TP 2-8, 8.5-9.3 us (SGLang
# PR 2904); vLLM's fused MoE kernel at batch 1 on H100, 40-45 us for
# Qwen3-30B-A3B FP8 against ~11 us of expert weights at peak bandwidth
# (vLLM PR 24700), ~30 us fixed.
START_LAYERS = {"collective_latency_us": 8.0, "moe_layer_us": 30.0}
# The one-way API server <-> engine core hop is a ZMQ message on one host plus an event-loop turn: the
# grid stops at 5 ms, so that the hop cannot stand in for engine time the model lacks (the fit without
# this bound picked 20 ms, docs/validation.md).
IPC_MS_GRID = (0.0, 0.5, 1.0, 2.0, 5.0)
# The API server's own time per request is served in turn (FIFO), so it bounds the requests per second
# one server takes: vLLM PR 41181 put 8,192 requests of 32 + 32 tokens through 4 API servers at 740
# requests/s, <= 5.4 ms of one server per request with its 32 streamed tokens. The grid stops below
# that bound: a fit without the runs of 1,000 requests at once (GPUStack held out) otherwise walked
# it to 32 ms to carry low-load time the model lacks, and those runs then queued 32 s for it.
REQUEST_MS_GRID = (0.0, 0.5, 1.0, 2.0, 4.0)
# The API server's time per streamed token is served in turn too, so one server streams at most
# 1 / output_token_us tokens a second: GPUStack's gpt-oss-20b ShareGPT run put 7,817 output tokens/s
# through one server (gpustack-gpt-oss-20b-h100-sharegpt), <= 128 us per token. The grid stops below
# that bound (without it the fits walked to 200-400 us, time the model lacks elsewhere).
OUTPUT_TOKEN_US_GRID = (0.0, 10.0, 25.0, 50.0, 75.0, 100.0)
# Sources whose TTFT does not measure what the model predicts, left out of
# the fits' TTFT terms (still reported): why, from independent-notes.md.
TTFT_NOT_FITTED = {
    "cloudera-dennislee22": "consecutive runs reuse the benchmark's seed with prefix caching on, so prompts hit "
    "the cache of earlier runs (the engine logs quote 42-43 % cumulative hit rates)",
}
ATTENTION_RATIO = RooflineParams().attention_efficiency / RooflineParams().compute_efficiency
# Where the walks start: the defaults (engine), and for the API server the
# cited figures (docs/cost-model.md, "The front end"): tokenization 1.3 us per
# token (vLLM PR 19334), a few ms per request, 100 us per streamed token.
START_FRONT_END = FrontEndParams(request_ms=4.0, prompt_token_us=1.3, output_token_us=100.0, ipc_ms=0.0)


@dataclass(frozen=True)
class Fitted:
    """Per-class efficiency factors, the weight reads' efficiency, the host terms and the API server's terms."""

    classes: dict[str, dict[str, float]] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    front_end: FrontEndParams = field(default_factory=FrontEndParams)
    # collective_latency_us and moe_layer_us (engine/roofline.py)
    layers: dict[str, float] = field(default_factory=lambda: dict(START_LAYERS))
    # memory_efficiency (weight reads), one value for every class
    weights: dict[str, float] = field(default_factory=dict)

    def params_for(self, gpu: str) -> RooflineParams:
        """The roofline factors a point on `gpu` runs with: its class's if fitted, else the defaults."""
        factors = self.classes.get(get_gpu(gpu).gpu_class, {})
        return replace(RooflineParams(), **{**factors, **self.weights, **self.host, **self.layers})

    def to_dict(self) -> dict:
        return {
            "classes": self.classes,
            "weights": self.weights,
            "host": self.host,
            "layers": self.layers,
            "front_end": asdict(self.front_end),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Fitted:
        layers = dict(data.get("layers", START_LAYERS))
        front_end = checked_front_end(dict(data["front_end"]))
        return cls(dict(data["classes"]), dict(data["host"]), front_end, layers, dict(data.get("weights", {})))


def score(point: Point, pred: Predicted) -> float:
    total = 0.0
    for key in METRIC_KEYS:
        if key == "mean_ttft_ms" and point.lab in TTFT_NOT_FITTED:
            continue
        pub = getattr(point.published, key)
        sim = getattr(pred, key)
        if pub and sim and sim > 0 and math.isfinite(sim):
            total += math.log(sim / pub) ** 2
    return total


class Runs:
    """Engine runs cached by (point, factors): the front end is replayed on them, not re-run."""

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self._runs: dict[tuple[str, RooflineParams], EngineRun] = {}
        self._predictions: dict[tuple[str, RooflineParams, FrontEndParams], Predicted] = {}
        self.log = log
        # `within(finished, total, clock_s)`: told how each engine run goes (validate-cost's progress).
        self.within: Callable[[int, int, float], None] | None = None

    def run(self, point: Point, params: RooflineParams) -> EngineRun:
        key = (point.id, relevant_params(point, params))
        if key not in self._runs:
            self._runs[key] = run_engines(point, params, within=self.within)
        return self._runs[key]

    def predict(self, point: Point, fitted: Fitted) -> Predicted:
        params = fitted.params_for(point.gpu)
        key = (point.id, params, fitted.front_end)
        if key not in self._predictions:
            self._predictions[key] = predict_from(self.run(point, params), fitted.front_end)
        return self._predictions[key]

    def total(self, points: Sequence[Point], fitted: Fitted) -> float:
        return sum(score(p, self.predict(p, fitted)) for p in points)


def relevant_params(point: Point, params: RooflineParams) -> RooflineParams:
    """`params` with the terms that cannot change `point`'s run set to the defaults: one engine run then
    serves every trial of a term the point does not see (no all-reduce at TP 1 and PP 1, no MoE layer
    in a dense model)."""
    d = RooflineParams()
    if point.tp == 1 and point.pp == 1:
        params = replace(params, collective_latency_us=d.collective_latency_us)
    if not get_model(point.model).is_moe:
        params = replace(params, moe_layer_us=d.moe_layer_us, moe_compute_efficiency=d.moe_compute_efficiency)
    return params


def _walk(grid: Sequence[float], start: float, f: Callable[[float], float]) -> float:
    i = min(range(len(grid)), key=lambda j: abs(grid[j] - start))
    while True:
        near = [j for j in (i - 1, i + 1) if 0 <= j < len(grid)]
        best = min(near, key=lambda j: f(grid[j]))
        if f(grid[best]) >= f(grid[i]):
            return grid[i]
        i = best


def _memo(f: Callable[[float], float]) -> Callable[[float], float]:
    seen: dict[float, float] = {}

    def g(x: float) -> float:
        if x not in seen:
            seen[x] = f(x)
        return seen[x]

    return g


def _factors(values: dict[str, float]) -> dict[str, float]:
    """A class's factors: the walked ones, attention at the defaults' ratio to the dense GEMMs'."""
    attention = round(min(1.0, values["compute_efficiency"] * ATTENTION_RATIO), 4)
    return {**values, "attention_efficiency": attention}


def class_terms(points: Sequence[Point]) -> list[str]:
    """The class factors a set of engine-bound points identifies: the dense GEMMs' and the K/V reads'
    always, the MoE experts' grouped GEMMs' where a MoE model is among them."""
    names = ["compute_efficiency", "kv_memory_efficiency"]
    if any(get_model(p.model).is_moe for p in points):
        names.insert(1, "moe_compute_efficiency")
    return names


def fit_class(runs: Runs, points: Sequence[Point], fitted: Fitted, cls: str) -> dict[str, float]:
    """Coordinate walks on the class's factors (class_terms), from the class's current ones (else the
    defaults)."""
    d = RooflineParams()
    grids: dict[str, Sequence[float]] = {"compute_efficiency": COMPUTE_GRID, "moe_compute_efficiency": COMPUTE_GRID}
    grids["kv_memory_efficiency"] = MEMORY_GRID
    start = fitted.classes.get(cls, {})
    values = {name: start.get(name, getattr(d, name)) for name in class_terms(points)}

    def total(trial_values: dict[str, float]) -> float:
        trial = replace(fitted, classes={**fitted.classes, cls: _factors(trial_values)})
        s = runs.total(points, trial)
        runs.log(f"  {cls}: {' '.join(f'{k}={v}' for k, v in trial_values.items())}: {s:.4f}")
        return s

    def along(name: str, base: dict[str, float]) -> Callable[[float], float]:
        return lambda x: total({**base, name: x})

    for _ in range(3):
        before = dict(values)
        for name in values:
            values[name] = _walk(grids[name], values[name], _memo(along(name, dict(values))))
        if values == before:
            break
    return _factors(values)


def fit(
    points: Sequence[Point],
    runs: Runs | None = None,
    log: Callable[[str], None] = print,
    start: Fitted | None = None,
) -> Fitted:
    """The parameters fitted on `points` (module docstring: which on which), the walks from the defaults, or
    from `start` (the in-sample fit, for a leave-one-source-out fit: what `points` do not identify dropped)."""
    runs = runs or Runs(log)
    if start is None:
        fitted, rounds = Fitted(front_end=START_FRONT_END), ENGINE_ROUNDS
    else:
        fitted, rounds = warm_start(points, start), 1
    # The groups share the engine-bound runs (their steps carry host time per row and the weight reads too):
    # fitted one after the other, a class's factors would absorb the terms fitted after them (per-row host
    # time at 0 pulls the K/V reads' efficiency down), so from the defaults the groups are walked twice, the
    # second round from the first's values; from a warm start, once.
    for _ in range(rounds):
        fitted = _fit_engine_round(points, fitted, runs, log)
    cheap = [p for p in points if is_cheap_replay(p)]
    log(f"fitting the front end on {[p.id for p in cheap]}")
    fe = fitted.front_end
    for _ in range(3):
        fe_new = _fit_front_end_round(runs, cheap, fitted, fe)
        if fe_new == fe:
            break
        fe = fe_new
    return replace(fitted, front_end=fe)


def warm_start(points: Sequence[Point], start: Fitted) -> Fitted:
    """`start` less what `points` cannot fit: a class without engine-bound points, the host time per row
    without large batches, the small steps' terms without low-load points, the API server's without cheap
    replays (those go back to the defaults and cited values, as a fit from scratch leaves them)."""
    classes = {c: v for c, v in start.classes.items() if any(is_engine_bound(p) and gpu_class(p) == c for p in points)}
    host = dict(start.host)
    if not any(is_large_batch(p) for p in points):
        host.pop("host_per_seq_us", None)
    low = any(is_low_load(p) for p in points)
    if not low:
        host.pop("host_overhead_ms", None)
    weights = dict(start.weights) if low else {}
    front_end = start.front_end if any(is_cheap_replay(p) for p in points) else START_FRONT_END
    return Fitted(classes, host, front_end, dict(start.layers), weights)


def _fit_engine_round(points: Sequence[Point], fitted: Fitted, runs: Runs, log: Callable[[str], None]) -> Fitted:
    """One walk of each engine-side group: the class factors, the host time per row, the small steps' terms."""
    for cls in sorted({gpu_class(p) for p in points if is_engine_bound(p)}):
        subset = [p for p in points if is_engine_bound(p) and gpu_class(p) == cls]
        log(f"fitting {cls} on {[p.id for p in subset]}")
        fitted = replace(fitted, classes={**fitted.classes, cls: fit_class(runs, subset, fitted, cls)})
    large = [p for p in points if is_large_batch(p)]
    if large:
        log(f"fitting host_per_seq_us on {[p.id for p in large]}")
        base = fitted

        def host_total(x: float) -> float:
            s = runs.total(large, replace(base, host={**base.host, "host_per_seq_us": x}))
            log(f"  host_per_seq_us={x}: {s:.4f}")
            return s

        x = _walk(HOST_PER_SEQ_GRID, base.host.get("host_per_seq_us", 0.0), _memo(host_total))
        fitted = replace(base, host={**base.host, "host_per_seq_us": x})
    return fit_fixed(points, fitted, runs, log)


def identified_terms(low: Sequence[Point]) -> list[str]:
    """What runs of a few rows identify: the weight reads' efficiency and the per-step host time always
    (such a step is its weight reads and its fixed times), the MoE layer's where one runs a MoE model."""
    names = ["memory_efficiency", "host_overhead_ms"]
    # The all-reduce's time is not among them though TP > 1 points may be: it keeps its cited value
    # (START_LAYERS), a measurement of the kernel vLLM runs at decode's message sizes on the GPUs those
    # points ran on; walked, it went to 32 us (4x the measurement) to carry gpt-oss-120b's per-layer time
    # that the model lacks elsewhere (docs/validation.md).
    if any(get_model(p.model).is_moe for p in low):
        names.append("moe_layer_us")
    return names


def fit_fixed(
    points: Sequence[Point],
    fitted: Fitted,
    runs: Runs,
    log: Callable[[str], None] = print,
    host: bool = True,
) -> Fitted:
    """`fitted` with the fixed times of small steps refitted on the low-load points of `points`:
    host_overhead_ms (unless `host` is False: then it keeps its value, and only the MoE points' runs
    change), moe_layer_us if a MoE point is among them (else, and the all-reduce always, START_LAYERS);
    coordinate walks from the current values."""
    low = [p for p in points if is_low_load(p)]
    if not low:
        return fitted
    grids: dict[str, Sequence[float]] = {
        "host_overhead_ms": HOST_OVERHEAD_GRID,
        "moe_layer_us": MOE_LAYER_US_GRID,
        "memory_efficiency": WEIGHT_MEMORY_GRID,
    }
    names = identified_terms(low)
    # host False (--fit-layers): only the per-layer term, which only MoE points' runs see.
    terms = [(name, grids[name]) for name in names if host or name in START_LAYERS]
    # A term the points do not identify goes back to its cited value.
    layers = {k: (fitted.layers.get(k, v) if k in names else v) for k, v in START_LAYERS.items()}
    fitted = replace(fitted, layers=layers)
    log(f"fitting {[name for name, _ in terms]} on {[p.id for p in low]}")

    def with_term(f: Fitted, name: str, x: float) -> Fitted:
        if name == "host_overhead_ms":
            return replace(f, host={**f.host, name: x})
        if name == "memory_efficiency":
            return replace(f, weights={name: x})
        return replace(f, layers={**f.layers, name: x})

    def current(f: Fitted, name: str) -> float:
        if name == "host_overhead_ms":
            return f.host.get(name, RooflineParams().host_overhead_ms)
        if name == "memory_efficiency":
            return f.weights.get(name, RooflineParams().memory_efficiency)
        return f.layers[name]

    for _ in range(3):
        before = fitted
        for name, grid in terms:
            base = fitted

            def total(x: float, name: str = name, base: Fitted = base) -> float:
                s = runs.total(low, with_term(base, name, x))
                log(f"  {name}={x}: {s:.4f}")
                return s

            fitted = with_term(fitted, name, _walk(grid, current(fitted, name), _memo(total)))
        if fitted == before:
            break
    return fitted


def _fit_front_end_round(runs: Runs, points: Sequence[Point], fitted: Fitted, fe: FrontEndParams) -> FrontEndParams:
    """One walk on each of request_ms, output_token_us and ipc_ms."""

    def total(**kw: float) -> float:
        s = runs.total(points, replace(fitted, front_end=replace(fe, **kw)))
        runs.log(f"  front end {kw}: {s:.4f}")
        return s

    r = _walk(REQUEST_MS_GRID, fe.request_ms, _memo(lambda x: total(request_ms=x)))
    o = _walk(OUTPUT_TOKEN_US_GRID, fe.output_token_us, _memo(lambda x: total(request_ms=r, output_token_us=x)))
    i = _walk(IPC_MS_GRID, fe.ipc_ms, _memo(lambda x: total(request_ms=r, output_token_us=o, ipc_ms=x)))
    return replace(fe, request_ms=r, output_token_us=o, ipc_ms=i)


def load_fitted(path: Path = FITTED) -> dict:
    """{"in_sample": Fitted, "held_out": {lab: Fitted}} as fitted.json stores them."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {
        "in_sample": Fitted.from_dict(data["in_sample"]),
        "held_out": {lab: Fitted.from_dict(v) for lab, v in data["held_out"].items()},
    }


def save_fitted(in_sample: Fitted, held_out: dict[str, Fitted], path: Path = FITTED) -> None:
    doc = {
        "_comment": "Parameters fitted by `disagg-sim validate-cost --fit` (bench/validation/fit.py): in_sample on "
        "every re-simulated point, held_out[lab] on every point but that source's (leave-one-source-out); "
        "docs/validation.md reports both.",
        "in_sample": in_sample.to_dict(),
        "held_out": {lab: f.to_dict() for lab, f in sorted(held_out.items())},
    }
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
