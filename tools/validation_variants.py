"""Run `disagg-sim validate-cost` with one or more fit variants that were tried and not adopted
(docs/validation.md, "What the errors say", the 2026-12-07 bullet), so their figures can be
reproduced. Each variant replaces one rule of bench/validation/fit.py for this process only.

    .venv/bin/python tools/validation_variants.py ttft-ray-serve,dense-from-dense -- \\
        --fit-from-stored --fitted /tmp/v/fitted.json --out /tmp/v/validation.md --results /tmp/v/results.json

Copy bench/validation/fitted.json to the --fitted path first: --fit-from-stored starts from it and
overwrites it. One full run takes 20-30 min on the shared 2-core machine.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.validation.fit as fit  # noqa: E402
import bench.validation.report as report  # noqa: E402
from bench.validation.dataset import Point  # noqa: E402
from engine.model_shape import get_model  # noqa: E402
from engine.roofline import RooflineParams  # noqa: E402

# The prior's width: a kernel's share of peak is taken to vary by a factor of 1.5 either way.
PRIOR_SIGMA = math.log(1.5)


def ttft_ray_serve() -> None:
    """Anyscale's TTFT out of the fits: its runs go through Ray Serve, not `vllm serve`."""
    fit.TTFT_NOT_FITTED["anyscale"] = "served through Ray Serve's ingress and PD-proxy replicas"


def rows_64() -> None:
    """The host time per row fitted on every aggregated point of >= 64 requests in flight."""

    def is_large_batch(point: Point) -> bool:
        rows = point.max_concurrency if point.max_concurrency is not None else point.num_prompts
        return not fit.is_pd(point) and rows >= 64

    fit.is_large_batch = is_large_batch
    report.is_large_batch = is_large_batch


def dense_from_dense() -> None:
    """A class's dense-GEMM factor walked only where a dense model is among its points."""
    walked = fit.class_terms
    factors = fit._factors

    def class_terms(points: Sequence[Point]) -> list[str]:
        names = walked(points)
        if all(get_model(p.model).is_moe for p in points):
            names.remove("compute_efficiency")
        return names

    def with_attention(values: dict[str, float]) -> dict[str, float]:
        if "compute_efficiency" in values:
            return factors(values)
        return {**values, "attention_efficiency": RooflineParams().attention_efficiency}

    fit.class_terms = class_terms
    fit._factors = with_attention


def prior() -> None:
    """Each class factor's walk scored with a log-normal prior at the defaults (PRIOR_SIGMA)."""
    d = RooflineParams()
    grids = {
        "compute_efficiency": fit.COMPUTE_GRID,
        "moe_compute_efficiency": fit.COMPUTE_GRID,
        "kv_memory_efficiency": fit.MEMORY_GRID,
    }

    def fit_class(runs: fit.Runs, points: Sequence[Point], fitted: fit.Fitted, cls: str) -> dict[str, float]:
        start = fitted.classes.get(cls, {})
        values = {name: start.get(name, getattr(d, name)) for name in fit.class_terms(points)}

        def total(trial: dict[str, float]) -> float:
            data = runs.total(points, replace(fitted, classes={**fitted.classes, cls: fit._factors(trial)}))
            penalty = sum((math.log(v / getattr(d, k)) / PRIOR_SIGMA) ** 2 for k, v in trial.items())
            runs.log(f"  {cls}: {trial}: {data:.4f} + prior {penalty:.4f}")
            return data + penalty

        def along(name: str, base: dict[str, float]) -> Callable[[float], float]:
            return lambda x: total({**base, name: x})

        for _ in range(3):
            before = dict(values)
            for name in values:
                values[name] = fit._walk(grids[name], values[name], fit._memo(along(name, dict(values))))
            if values == before:
                break
        return fit._factors(values)

    fit.fit_class = fit_class


def itl() -> None:
    """The mean ITL scored too, where a point publishes it (a decode step's length, which the per-request
    TPOT mixes with the stalls of short requests)."""
    fit.METRIC_KEYS = (*fit.METRIC_KEYS, "mean_itl_ms")


VARIANTS: dict[str, Callable[[], None]] = {
    "ttft-ray-serve": ttft_ray_serve,
    "rows-64": rows_64,
    "dense-from-dense": dense_from_dense,
    "prior": prior,
    "itl": itl,
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "--":
        print(f"usage: {Path(__file__).name} VARIANT[,VARIANT...] -- validate-cost args", file=sys.stderr)
        return 2
    for name in argv[0].split(","):
        if name not in VARIANTS:
            print(f"variant {name!r} is unknown; allowed: {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
        VARIANTS[name]()
    from bench.commands.main import main as cli

    return cli(["validate-cost", *argv[2:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
