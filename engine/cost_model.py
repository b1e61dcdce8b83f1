"""Step time from the batch shape: a small linear model.

    duration = base_ms + prefill_ms_per_token * prefill_tokens
             + decode_ms_per_token * decode_tokens
             + context_ms_per_ktoken * total_context_tokens / 1000

Coefficient sets are named and selectable. Every built-in linear set is
SYNTHETIC: chosen to be of the order reported for an 8B-class model on one
modern datacenter GPU (a decode step of a few tens of ms at batch 64-128,
prefill at several thousand tokens/s), not fitted to any measurement. Users
who have measurements supply their own set (`CostModel.from_dict`) or fit one
(`disagg-sim calibrate`).

The physical model is the roofline (engine/roofline.py); its presets
(engine/data/presets.json, e.g. `llama-3.1-8b-h100`) are selected by name here
too. Both kinds answer `step_time(shape)`: `StepCostModel`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

# The step's shape lives in its own module so that the roofline can read it
# without importing this one (which builds roofline models by name).
from .setting import check_declared, setting
from .step_shape import StepShape as StepShape

# Bound of one term: an hour per step, per token or per 1k tokens of context.
MAX_TERM_MS = 3_600_000


@dataclass(frozen=True)
class CostModel:
    """A linear set. Its terms are declared here (engine/setting.py): the
    scenario's custom cost model derives its keys from them and validates
    them; a mapping from elsewhere goes through `from_dict`, which checks."""

    name: str
    base_ms: float = setting(doc="Every step's fixed time.", ge=0, le=MAX_TERM_MS)
    prefill_ms_per_token: float = setting(doc="Per prompt token scheduled.", ge=0, le=MAX_TERM_MS)
    decode_ms_per_token: float = setting(doc="Per decode token scheduled.", ge=0, le=MAX_TERM_MS)
    context_ms_per_ktoken: float = setting(doc="Per 1,000 tokens of context attended to.", ge=0, le=MAX_TERM_MS)

    def step_time(self, shape: StepShape) -> float:
        """Seconds for one step of this shape; an empty step costs nothing."""
        if shape.total_tokens == 0:
            return 0.0
        return self._seconds(shape.prefill_tokens, shape.decode_tokens, shape.context_tokens)

    def decode_step_time(self, batch_size: int, context_tokens: int) -> float:
        """`step_time` of a decode-only step (`batch_size` requests, one
        token each, attending to `context_tokens`), without building its
        shape (the steady-decode fast-forward's per-step cost)."""
        return self._seconds(0, batch_size, context_tokens)

    def _seconds(self, prefill_tokens: int, decode_tokens: int, context_tokens: int) -> float:
        ms = (
            self.base_ms
            + self.prefill_ms_per_token * prefill_tokens
            + self.decode_ms_per_token * decode_tokens
            + self.context_ms_per_ktoken * context_tokens / 1000.0
        )
        return ms / 1000.0

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        allowed = {"name", "base_ms", "prefill_ms_per_token", "decode_ms_per_token", "context_ms_per_ktoken"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"cost model: unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        for name in sorted(allowed - {"name"}):
            if name not in data:
                raise ValueError(f"cost model: {name} is missing; allowed: a number >= 0")
            check_declared(cls, name, data[name], "CostModel")
        return cls(**{"name": "custom", **data})

    def to_dict(self) -> dict:
        return asdict(self)


class StepCostModel(Protocol):
    """What a node needs of a cost model: a name and a step's seconds."""

    @property
    def name(self) -> str: ...

    def step_time(self, shape: StepShape) -> float: ...

    def to_dict(self) -> dict: ...


COST_MODELS: dict[str, CostModel] = {
    # Synthetic: ~8 ms fixed cost, ~0.15 ms per prefill token (~6.7k tok/s),
    # ~0.1 ms per decode sequence, ~0.02 ms per 1k tokens of attended context.
    "synthetic-8b": CostModel("synthetic-8b", 8.0, 0.15, 0.1, 0.02),
    # Synthetic, a larger model: everything ~4.5x slower.
    "synthetic-70b": CostModel("synthetic-70b", 30.0, 0.7, 0.4, 0.09),
    # Synthetic unit model for tests: 1 ms per step + 0.01 ms per token.
    "unit": CostModel("unit", 1.0, 0.01, 0.01, 0.0),
}


def cost_model_names() -> list[str]:
    """Every name `get_cost_model` takes: the synthetic sets and the roofline presets."""
    from .model_shape import shipped_presets

    return sorted(COST_MODELS) + sorted(shipped_presets())


def get_cost_model(name_or_dict: str | dict | StepCostModel) -> StepCostModel:
    """A synthetic set or roofline preset by name; a dict of linear
    coefficients; or a roofline dict (it has `model` and `gpu`)."""
    from .model_shape import shipped_presets
    from .roofline import RooflineCostModel

    if isinstance(name_or_dict, dict):
        if "model" in name_or_dict or "gpu" in name_or_dict:
            return RooflineCostModel.from_dict(name_or_dict)
        return CostModel.from_dict(name_or_dict)
    if not isinstance(name_or_dict, str):
        return name_or_dict
    if name_or_dict in COST_MODELS:
        return COST_MODELS[name_or_dict]
    presets = shipped_presets()
    if name_or_dict in presets:
        return RooflineCostModel.from_dict({"name": name_or_dict, **presets[name_or_dict]})
    raise ValueError(
        f"cost_model={name_or_dict!r} is unknown; allowed: {cost_model_names()} or a mapping "
        "(linear coefficients, or a roofline's model and gpu)"
    )
