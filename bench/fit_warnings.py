"""What a fitted cost model cannot be trusted for: factors on a bound and
factors the data cannot identify.

A least-squares fit always returns numbers. Two ways they mislead, both
seen on a concurrency-1 `vllm bench serve` run:

- **on a bound**: an efficiency pinned at 1.0 (its limit) or a linear
  coefficient clipped at 0 means the data wanted a value the model does not
  allow — usually time the model has no term for (queueing, HTTP, the
  front end in TTFT), or the wrong GPU/model preset;
- **not identifiable**: a factor the predicted step times barely depend on
  (no compute-bound step: `compute_efficiency` is free), or two factors the
  data move in lock-step (batch-1 decode: memory bandwidth and the host
  overhead cannot be told apart). The fit then picks one of many equally
  good values.

Both are found from the model and the points alone: the sensitivity of each
predicted step time to a 1 % change of each factor (a Jacobian in
elasticities), its size, and the angle between two factors' columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import numpy as np

from engine.cost_model import CostModel, StepShape
from engine.roofline import RooflineCostModel

EFFICIENCIES = ("compute_efficiency", "attention_efficiency", "memory_efficiency", "kv_memory_efficiency")
FACTORS = (*EFFICIENCIES, "host_overhead_ms")
# A factor whose 1 % change moves the predicted times by less than this (RMS, in %) is not identifiable.
MIN_ELASTICITY = 0.05
# Two factors whose sensitivity columns are closer than this (|cosine|) cannot be told apart.
MAX_COSINE = 0.995
_DELTA = 0.01

Point = tuple[StepShape, float]


def _elasticities(model: RooflineCostModel, points: Sequence[Point]) -> dict[str, np.ndarray]:
    """Per factor, d log(predicted time) / d log(factor) at each point."""
    base = np.array([model.step_time(s) for s, _ in points])
    out = {}
    for name in FACTORS:
        value = getattr(model.params, name)
        if value == 0:
            value, bumped = 0.0, model.with_params(**{name: 1e-3})  # an overhead at 0: sensitivity to 1 µs
            step = np.array([bumped.step_time(s) for s, _ in points]) - base
            out[name] = step / np.maximum(base, 1e-12) / _DELTA
            continue
        # Efficiencies may not exceed 1: perturb downwards.
        bumped = model.with_params(**{name: value * (1 - _DELTA)})
        moved = np.array([bumped.step_time(s) for s, _ in points])
        out[name] = (moved - base) / np.maximum(base, 1e-12) / -_DELTA
    return out


def roofline_warnings(model: RooflineCostModel, points: Sequence[Point]) -> list[str]:
    out = []
    for name in EFFICIENCIES:
        value = getattr(model.params, name)
        if value >= 1.0 - 1e-9:
            out.append(
                f"{name} sits on its bound 1.0: the data want the hardware faster than its peak — time the model "
                "has no term for (queueing, HTTP, the front end in TTFT), or a preset of another model or GPU"
            )
    cols = _elasticities(model, points)
    weak = []
    for name, col in cols.items():
        if float(np.sqrt(np.mean(col**2))) < MIN_ELASTICITY:
            weak.append(name)
            out.append(
                f"{name} is not identifiable from these points: no step's time depends on it, so its value "
                f"({getattr(model.params, name):g}) is not a measurement; keep the preset's, or add steps where it "
                "matters"
            )
    names = [n for n in FACTORS if n not in weak]
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ca, cb = cols[a], cols[b]
            cos = float(np.dot(ca, cb) / (np.linalg.norm(ca) * np.linalg.norm(cb)))
            if abs(cos) > MAX_COSINE:
                out.append(
                    f"{a} and {b} cannot be told apart by these points (they change every step time in the "
                    "same proportion): only their combination is fitted; add points of other batch sizes and lengths"
                )
    return out


def linear_warnings(model: CostModel) -> list[str]:
    out = []
    for f in fields(model):
        value = getattr(model, f.name)
        if f.name != "name" and isinstance(value, float) and value == 0.0:
            out.append(
                f"{f.name} sits on its bound 0: the data want it negative, which a step time cannot be; "
                "the other coefficients absorb the rest"
            )
    return out


def fit_warnings(model, points: Sequence[Point]) -> list[str]:
    """Every warning about a fitted model, in plain sentences."""
    if isinstance(model, RooflineCostModel):
        return roofline_warnings(model, points)
    return linear_warnings(model)
