"""Token-length distributions for prompts and outputs.

Every distribution draws integers >= 1 (a request has at least one prompt and
one output token) from a numpy Generator, then clips to [min, max]. The `kind`
field selects the distribution; pydantic's discriminated union turns an
unknown kind into an error that lists the allowed kinds.
"""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cluster.settings_base import scenario_relative

# Longest length a distribution may name (tokens): far above any model's
# context, low enough that a typo is refused at load.
MAX_LENGTH = 10_000_000


class _LengthBase(BaseModel):
    # No inf/NaN parameters: they overflow the draw (e.g. exp of a huge mu).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # Clip bounds applied after drawing; `min` never goes below 1.
    min: int = Field(1, ge=1, le=MAX_LENGTH)
    max: int | None = Field(None, ge=1, le=MAX_LENGTH)

    @model_validator(mode="after")
    def _check_bounds(self):
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> list[int]:
        raw = np.asarray(self._draw(rng, n), dtype=float)
        # Round half away from zero would bias nothing measurable; rint is
        # numpy's banker's rounding and is deterministic, which is what counts.
        values = np.rint(raw)
        hi = self.max if self.max is not None else np.inf
        values = np.clip(values, self.min, hi)
        return [int(v) for v in values]

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError


class FixedLength(_LengthBase):
    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, le=MAX_LENGTH)

    def _draw(self, rng, n):
        return np.full(n, self.value)


class UniformLengths(_LengthBase):
    """Integers uniform on [low, high], both ends included."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, le=MAX_LENGTH)
    high: int = Field(ge=1, le=MAX_LENGTH)

    @model_validator(mode="after")
    def _check_range(self):
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def _draw(self, rng, n):
        return rng.integers(self.low, self.high + 1, size=n)


class NormalLengths(_LengthBase):
    """Normal(mean, std), rounded and clipped to >= min (default 1)."""

    kind: Literal["normal"] = "normal"
    mean: float = Field(gt=0, le=MAX_LENGTH)
    std: float = Field(ge=0, le=MAX_LENGTH)

    def _draw(self, rng, n):
        return rng.normal(self.mean, self.std, size=n)


class LognormalLengths(_LengthBase):
    """exp(Normal(mu, sigma)): numpy's parametrisation, so median = exp(mu).

    `mu` and `sigma` are in log space: `mu: 4.6` is a median of ~100 tokens.
    The bounds keep exp() finite: mu <= 16.2 is a median of ~10M tokens."""

    kind: Literal["lognormal"] = "lognormal"
    mu: float = Field(ge=-20, le=16.2)
    sigma: float = Field(ge=0, le=10)

    def _draw(self, rng, n):
        return rng.lognormal(self.mu, self.sigma, size=n)


# Synthetic ShareGPT-like shapes. These are NOT fitted to the ShareGPT data
# set: they are hand-picked lognormals with a long right tail, a median prompt
# around a hundred tokens and a median output around two hundred, which is the
# order of magnitude serving papers report for ShareGPT. The bounds mimic
# vLLM's `is_valid_sequence` pruning used by `vllm bench serve --dataset-name
# sharegpt` (min_len=4, max_prompt_len=1024, max_total_len=2048): out-of-range
# draws are redrawn, not clipped, just as vLLM drops such samples. Capping the
# output at 1024 too keeps prompt + output <= 2048 without coupling the draws.
SHAREGPT_LIKE_PARAMS: dict[str, dict[str, float]] = {
    "prompt": {"mu": math.log(110.0), "sigma": 1.0, "low": 4, "high": 1024},
    "output": {"mu": math.log(220.0), "sigma": 0.9, "low": 4, "high": 1024},
}


class ShareGPTLikeLengths(_LengthBase):
    """Synthetic long-tailed lengths shaped like ShareGPT (see SHAREGPT_LIKE_PARAMS)."""

    kind: Literal["sharegpt_like"] = "sharegpt_like"
    part: Literal["prompt", "output"]

    def _draw(self, rng, n):
        p = SHAREGPT_LIKE_PARAMS[self.part]
        out = np.empty(0)
        while out.size < n:
            batch = np.rint(rng.lognormal(p["mu"], p["sigma"], size=max(n, 16)))
            batch = batch[(batch >= p["low"]) & (batch <= p["high"])]
            out = np.concatenate([out, batch])
        return out[:n]


class EmpiricalCDFError(ValueError):
    pass


@functools.lru_cache(maxsize=32)
def load_empirical_cdf(path: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Read a CSV of `value,cdf` rows (an optional `value,cdf` header is allowed).

    Values must be integers >= 1 in strictly increasing order; cdf must be
    non-decreasing in [0, 1] and end at 1. Errors name the file and line.
    """
    p = Path(path)
    if not p.is_file():
        # Shown resolved: a relative path here is the working directory's (a scenario file's were resolved
        # against its directory when it was validated).
        how = "an absolute path" if p.is_absolute() else f"relative to the working directory, {Path.cwd()}"
        raise EmpiricalCDFError(f"{path}: empirical CDF file not found at {p.resolve()} ({how})")
    values: list[int] = []
    cdfs: list[float] = []
    with p.open(newline="") as fh:
        for lineno, row in enumerate(csv.reader(fh), start=1):
            if not row or all(not c.strip() for c in row) or row[0].lstrip().startswith("#"):
                continue
            where = f"{path}:{lineno}"
            if lineno == 1 and [c.strip().lower() for c in row] == ["value", "cdf"]:
                continue
            if len(row) != 2:
                raise EmpiricalCDFError(f"{where}: expected 2 columns 'value,cdf', got {len(row)}: {row!r}")
            try:
                value = int(row[0].strip())
            except ValueError:
                raise EmpiricalCDFError(f"{where}: value {row[0]!r} is not an integer") from None
            try:
                cdf = float(row[1].strip())
            except ValueError:
                raise EmpiricalCDFError(f"{where}: cdf {row[1]!r} is not a number") from None
            if value < 1:
                raise EmpiricalCDFError(f"{where}: value {value} must be >= 1")
            if not 0.0 <= cdf <= 1.0:
                raise EmpiricalCDFError(f"{where}: cdf {cdf} must be within [0, 1]")
            if values and value <= values[-1]:
                raise EmpiricalCDFError(f"{where}: values must strictly increase ({value} after {values[-1]})")
            if cdfs and cdf < cdfs[-1]:
                raise EmpiricalCDFError(f"{where}: cdf must not decrease ({cdf} after {cdfs[-1]})")
            values.append(value)
            cdfs.append(cdf)
    if not values:
        raise EmpiricalCDFError(f"{path}: no 'value,cdf' rows found")
    if abs(cdfs[-1] - 1.0) > 1e-9:
        raise EmpiricalCDFError(f"{path}: last cdf is {cdfs[-1]}, must be 1.0")
    return tuple(values), tuple(cdfs)


class EmpiricalLengths(_LengthBase):
    """Inverse-CDF sampling from a `value,cdf` CSV (`path`: relative to the scenario file's directory, as
    `trace.path` is): the smallest value whose cdf >= u."""

    kind: Literal["empirical"] = "empirical"
    path: str

    @field_validator("path", mode="after")
    @classmethod
    def _relative_to_the_scenario(cls, path: str, info: ValidationInfo) -> str:
        """A relative path in a scenario file is the scenario file's directory's, as a trace's is
        (cluster/settings_base.py `scenario_relative`); kept resolved, so the results say which file was
        read. Without a scenario (a spec built in code) it stays the working directory's."""
        where, how = scenario_relative(path, info.context)
        if where != path and not Path(where).is_file():
            raise EmpiricalCDFError(f"{path}: empirical CDF file not found at {where} ({how})")
        return where

    @model_validator(mode="after")
    def _load(self):
        # Load at validation time so a bad file fails with the spec, not mid-run.
        load_empirical_cdf(self.path)
        return self

    def _draw(self, rng, n):
        values, cdfs = load_empirical_cdf(self.path)
        idx = np.searchsorted(np.asarray(cdfs), rng.random(n), side="left")
        return np.asarray(values)[np.minimum(idx, len(values) - 1)]


LengthSpec = Annotated[
    FixedLength | UniformLengths | NormalLengths | LognormalLengths | ShareGPTLikeLengths | EmpiricalLengths,
    Field(discriminator="kind"),
]
