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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.validation.fit as fit  # noqa: E402
import bench.validation.report as report  # noqa: E402
import bench.validation.roles as roles  # noqa: E402
from bench.validation.dataset import Point  # noqa: E402
from engine.model_shape import get_model  # noqa: E402
from engine.roofline import RooflineParams  # noqa: E402

# The prior's width: a kernel's share of peak is taken to vary by a factor of 1.5 either way.
PRIOR_SIGMA = math.log(1.5)


def ttft_ray_serve() -> None:
    """Anyscale's TTFT out of the fits: its runs go through Ray Serve, not `vllm serve`."""
    fit.TTFT_NOT_FITTED["anyscale"] = "served through Ray Serve's ingress and PD-proxy replicas"


def rows_500() -> None:
    """The host time per row fitted only on the points of >= 500 requests at once (the rule until
    2026-12-07: GPUStack's runs alone)."""

    def is_large_batch(point: Point) -> bool:
        return not roles.is_pd(point) and point.num_prompts >= 500 and point.max_concurrency is None

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


class _WithPrior:
    """`runs` whose score of a trial adds a log-normal prior at the defaults on the factors walked for `cls`
    (fit.fit_class's walk scores every trial through `total`)."""

    def __init__(self, runs: fit.Runs, cls: str, names: Sequence[str]) -> None:
        self.runs, self.cls, self.names = runs, cls, names
        self.log = runs.log

    def total(self, points: Sequence[Point], trial: fit.Fitted) -> float:
        d, factors = RooflineParams(), trial.classes[self.cls]
        penalty = sum((math.log(factors[k] / getattr(d, k)) / PRIOR_SIGMA) ** 2 for k in self.names)
        return self.runs.total(points, trial) + penalty


def prior() -> None:
    """Each class factor's walk scored with a log-normal prior at the defaults (PRIOR_SIGMA)."""
    walk = fit.fit_class

    def fit_class(runs: fit.Runs, points: Sequence[Point], fitted: fit.Fitted, cls: str) -> dict[str, float]:
        return walk(_WithPrior(runs, cls, fit.class_terms(points)), points, fitted, cls)  # type: ignore[arg-type]

    fit.fit_class = fit_class


def itl() -> None:
    """The mean ITL scored too, where a point publishes it (a decode step's length, which the per-request
    TPOT mixes with the stalls of short requests)."""
    fit.METRIC_KEYS = (*fit.METRIC_KEYS, "mean_itl_ms")  # type: ignore[assignment]  # one metric more


VARIANTS: dict[str, Callable[[], None]] = {
    "ttft-ray-serve": ttft_ray_serve,
    "rows-500": rows_500,
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
