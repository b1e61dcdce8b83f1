"""The cost model of a scenario's cluster (`cluster.cost_model`: a linear
set or a roofline) and the API server in front of it (`cluster.front_end`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from engine.front_end import DEFAULT_FRONT_END, FrontEndParams, front_end_params
from engine.roofline import RooflineCostModel

from .settings_base import MAX_PP, StrictModel


class CostModelSettings(StrictModel):
    """A custom cost model: a step takes base_ms + per-token terms (engine/cost_model.py)."""

    name: str = Field("custom", min_length=1, max_length=100)
    base_ms: float = Field(ge=0, le=3_600_000)
    prefill_ms_per_token: float = Field(ge=0, le=3_600_000)
    decode_ms_per_token: float = Field(ge=0, le=3_600_000)
    context_ms_per_ktoken: float = Field(ge=0, le=3_600_000)


class RooflineSettings(StrictModel):
    """A roofline cost model (engine/roofline.py): a model's config.json fields on a GPU's datasheet figures.
    A factor left unset (null) takes the GPU's measured one (engine/data/gpus.json `efficiency`), else
    engine/roofline.py's default; a number given here wins."""

    # The factors default to None, not to numbers: dumped defaults used to
    # override the GPU's measured factors (issue 32).

    name: str = Field("custom", min_length=1, max_length=100)
    # A shipped model name (engine/data/models.json) or config.json fields.
    model: str | dict
    # A shipped GPU name (engine/data/gpus.json) or its figures.
    gpu: str | dict
    tp: int = Field(1, ge=1, le=MAX_PP)
    pp: int = Field(1, ge=1, le=MAX_PP)
    # Weights' dtype: "auto" (the checkpoint's), "bf16", or "fp8" (vLLM --quantization fp8:
    # one byte per weight, GEMMs at the GPU's FP8 peak), or "mxfp4" (gpt-oss: MoE experts at 4.25 bits).
    dtype: Literal["auto", "bf16", "fp8", "mxfp4"] = "auto"
    # KV cache dtype: "auto" (the checkpoint's) or "fp8" (vLLM --kv-cache-dtype fp8: one byte per value).
    kv_cache_dtype: Literal["auto", "bf16", "fp8"] = "auto"
    # Host time per step: host_overhead_ms + host_per_seq_us x rows + host_per_token_us x tokens.
    host_overhead_ms: float | None = Field(None, ge=0, le=3_600_000)
    host_per_seq_us: float | None = Field(None, ge=0, le=3_600_000)
    host_per_token_us: float | None = Field(None, ge=0, le=3_600_000)
    compute_efficiency: float | None = Field(None, gt=0, le=1)
    attention_efficiency: float | None = Field(None, gt=0, le=1)
    memory_efficiency: float | None = Field(None, gt=0, le=1)
    collective_latency_us: float | None = Field(None, ge=0, le=3_600_000)

    @model_validator(mode="after")
    def _builds(self) -> RooflineSettings:
        RooflineCostModel.from_dict(self.roofline_dict())  # unknown names, bad config fields
        return self

    def roofline_dict(self) -> dict:
        """What RooflineCostModel.from_dict takes: the factors given, none of the unset ones."""
        return self.model_dump(exclude_none=True)


class FrontEndSettings(StrictModel):
    """vLLM's API server in front of each engine (engine/front_end.py): per request its parsing, chat template and
    tokenization, per output token its detokenization and streaming, served one at a time (FIFO). Applied by the
    proxy; until the proxy calls it, `disagg-sim validate-cost` applies it when it re-simulates published runs."""

    # A preset of engine/data/front_end.json ("off": none).
    preset: str = Field(DEFAULT_FRONT_END, min_length=1, max_length=100)
    # Overrides of the preset's terms; unset (null) keeps the preset's.
    request_ms: float | None = Field(None, ge=0, le=3_600_000)
    prompt_token_us: float | None = Field(None, ge=0, le=3_600_000)
    output_token_us: float | None = Field(None, ge=0, le=3_600_000)
    ipc_ms: float | None = Field(None, ge=0, le=3_600_000)

    @model_validator(mode="after")
    def _known_preset(self) -> FrontEndSettings:
        self.params()  # an unknown preset names the allowed ones
        return self

    def params(self) -> FrontEndParams:
        overrides = {k: v for k, v in self.model_dump(exclude={"preset"}).items() if v is not None}
        return front_end_params(self.preset, **overrides)


def load_preset_file(path: str) -> dict:
    """A preset file (`disagg-sim calibrate` writes them): JSON, a cost model mapping."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"cost_model={path!r}: cannot read the preset file ({err}); allowed: a JSON file") from None
    if not isinstance(data, dict):
        raise ValueError(f"cost_model={path!r}: the preset file holds {type(data).__name__}; allowed: a mapping")
    return data
