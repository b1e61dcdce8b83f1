"""Fit the roofline's efficiency factors once, per GPU, on a subset of the
published points, and keep them in fitted.json (docs/validation.md, "How the
factors were fitted").

Why per GPU: the factors are shares of a datasheet peak that a GPU's kernels
reach, and the H100 reaches a smaller share of its (much larger) peak than the
A100 does; one set for both leaves one GPU 30-50 % off. Why a subset: the
points not fitted on (another model, other workloads) say whether the fit
generalises, which one set fitted on everything cannot.

The search: a coordinate descent over `compute_efficiency` (attention kernels
kept at the defaults' ratio to it) and `memory_efficiency`, each a walk along
its grid from the defaults to the neighbour that scores lower until none
does, scoring the sum of squared log errors of mean TTFT, mean TPOT and output
throughput.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from engine.roofline import RooflineParams

from .dataset import Point
from .simulate import Predicted, simulate

FITTED = Path(__file__).resolve().parent / "fitted.json"
# Fitted on: one model (Qwen3-14B), the random-length cases whose time is the
# engine's (the 128-token case is bound by the API server's per-request work,
# ShareGPT's lengths are not published per request): 3 points per GPU.
FIT_MODEL = "qwen3-14b"
FIT_CASES = ("random-32k", "random-4k", "random-2k")
COMPUTE_GRID = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8)
MEMORY_GRID = (0.5, 0.6, 0.7, 0.8, 0.9)
ATTENTION_RATIO = RooflineParams().attention_efficiency / RooflineParams().compute_efficiency


def is_fit_point(point: Point) -> bool:
    return point.model == FIT_MODEL and point.id.endswith(FIT_CASES)


def score(point: Point, pred: Predicted) -> float:
    pub = point.published
    pairs = (
        (pred.mean_ttft_ms, pub.mean_ttft_ms),
        (pred.mean_tpot_ms, pub.mean_tpot_ms),
        (pred.output_throughput, pub.output_throughput),
    )
    return sum(math.log(a / b) ** 2 for a, b in pairs)


def _params(compute: float, memory: float) -> RooflineParams:
    attention = round(min(1.0, compute * ATTENTION_RATIO), 4)
    return replace(
        RooflineParams(), compute_efficiency=compute, attention_efficiency=attention, memory_efficiency=memory
    )


def fit_gpu(points: Sequence[Point], log: Callable[[str], None] = print) -> RooflineParams:
    """Coordinate descent on the grids, from the defaults."""
    cache: dict[tuple[float, float], float] = {}

    def total(c: float, m: float) -> float:
        if (c, m) not in cache:
            cache[(c, m)] = sum(score(p, simulate(p, _params(c, m))) for p in points)
            log(f"  compute_efficiency={c} memory_efficiency={m}: {cache[(c, m)]:.4f}")
        return cache[(c, m)]

    def walk(grid: Sequence[float], start: float, f: Callable[[float], float]) -> float:
        i = grid.index(start)
        while True:
            near = [j for j in (i - 1, i + 1) if 0 <= j < len(grid)]
            best = min(near, key=lambda j: f(grid[j]))
            if f(grid[best]) >= f(grid[i]):
                return grid[i]
            i = best

    def at_memory(m: float) -> Callable[[float], float]:
        return lambda x: total(x, m)

    def at_compute(c: float) -> Callable[[float], float]:
        return lambda x: total(c, x)

    c, m = RooflineParams().compute_efficiency, RooflineParams().memory_efficiency
    for _ in range(3):
        c_new = walk(COMPUTE_GRID, c, at_memory(m))
        m_new = walk(MEMORY_GRID, m, at_compute(c_new))
        if (c_new, m_new) == (c, m):
            break
        c, m = c_new, m_new
    return _params(c, m)


def fit(points: Sequence[Point], log: Callable[[str], None] = print) -> dict[str, dict]:
    """{gpu: RooflineParams fields} for every GPU with fit points."""
    out: dict[str, dict] = {}
    for gpu in sorted({p.gpu for p in points if is_fit_point(p)}):
        subset = [p for p in points if p.gpu == gpu and is_fit_point(p)]
        log(f"fitting {gpu} on {[p.id for p in subset]}")
        out[gpu] = vars(fit_gpu(subset, log))
    return out


def load_fitted(path: Path = FITTED) -> dict[str, RooflineParams]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return {gpu: RooflineParams(**v) for gpu, v in data["gpus"].items()}


def save_fitted(fitted: dict[str, dict], points: Sequence[Point], path: Path = FITTED) -> None:
    doc = {
        "_comment": "Roofline efficiency factors per GPU, fitted by `disagg-sim validate-cost --fit` on the points "
        "in `fit_points` (bench/validation/fit.py); docs/validation.md reports them on every point.",
        "fit_points": sorted(p.id for p in points if is_fit_point(p)),
        "gpus": fitted,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
