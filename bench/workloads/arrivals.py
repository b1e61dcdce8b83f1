"""Arrival processes, shaped like `vllm bench serve`'s request generator.

vLLM draws each inter-arrival gap from Gamma(shape=burstiness,
scale=1/(rate*burstiness)) — burstiness 1 is a Poisson process — sums the
gaps (so the first request already waits one gap), and then rescales all
arrival times so the last one lands exactly at num_requests / rate. That
rescaling keeps throughput numbers stable across seeds; `normalize=False`
turns it off. A rate of infinity (here: `all_at_once`) releases everything at
time 0; burstiness infinity (here: `constant`) spaces requests 1/rate apart.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

# A million requests per second is far beyond one cluster; `.inf` is spelled
# `kind: all_at_once` here.
MAX_RATE = 1_000_000.0


class _ArrivalBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def offsets(self, rng: np.random.Generator, n: int) -> list[float]:  # pragma: no cover
        raise NotImplementedError


def _gamma_offsets(rng: np.random.Generator, n: int, rate: float, burstiness: float, normalize: bool) -> list[float]:
    theta = 1.0 / (rate * burstiness)
    times = np.cumsum(rng.gamma(shape=burstiness, scale=theta, size=n))
    if normalize and n > 0 and times[-1] != 0:
        times = times * ((n / rate) / times[-1])
    return [float(t) for t in times]


class PoissonArrivals(_ArrivalBase):
    """Exponential gaps at `rate` requests/s (vLLM's default, burstiness 1)."""

    kind: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0, le=MAX_RATE)
    normalize: bool = True

    def offsets(self, rng, n):
        return _gamma_offsets(rng, n, self.rate, 1.0, self.normalize)


class GammaArrivals(_ArrivalBase):
    """Gamma gaps: burstiness < 1 is burstier than Poisson, > 1 is smoother."""

    kind: Literal["gamma"] = "gamma"
    rate: float = Field(gt=0, le=MAX_RATE)
    burstiness: float = Field(ge=1e-3, le=1e6)
    normalize: bool = True

    def offsets(self, rng, n):
        return _gamma_offsets(rng, n, self.rate, self.burstiness, self.normalize)


class ConstantArrivals(_ArrivalBase):
    """Evenly spaced: request i arrives at (i + 1) / rate, as vLLM does for burstiness=inf."""

    kind: Literal["constant"] = "constant"
    rate: float = Field(gt=0, le=MAX_RATE)

    def offsets(self, rng, n):
        return [(i + 1) / self.rate for i in range(n)]


class AllAtOnceArrivals(_ArrivalBase):
    """Everything at time 0 (vLLM's request_rate=inf). With `max_concurrency`
    on the workload this is a closed loop: the driver keeps that many in flight."""

    kind: Literal["all_at_once"] = "all_at_once"

    def offsets(self, rng, n):
        return [0.0] * n


ArrivalSpec = Annotated[
    PoissonArrivals | GammaArrivals | ConstantArrivals | AllAtOnceArrivals,
    Field(discriminator="kind"),
]
