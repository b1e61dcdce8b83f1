"""The cost model of a scenario's cluster (`cluster.cost_model`: a linear
set or a roofline) and the API server in front of it (`cluster.front_end`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from engine.cost_model import CostModel
from engine.front_end import DEFAULT_FRONT_END, FrontEndParams, front_end_params
from engine.roofline import KVCacheDtype, RooflineCostModel, RooflineParams, WeightDtype

from .settings_base import StrictModel, from_setting


class CostModelSettings(StrictModel):
    """A custom cost model: a step takes base_ms + per-token terms (engine/cost_model.py)."""

    name: str = Field("custom", min_length=1, max_length=100)
    base_ms: float = from_setting(CostModel, "base_ms")
    prefill_ms_per_token: float = from_setting(CostModel, "prefill_ms_per_token")
    decode_ms_per_token: float = from_setting(CostModel, "decode_ms_per_token")
    context_ms_per_ktoken: float = from_setting(CostModel, "context_ms_per_ktoken")


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
    tp: int = from_setting(RooflineCostModel, "tp")
    pp: int = from_setting(RooflineCostModel, "pp")
    dtype: WeightDtype = from_setting(RooflineCostModel, "dtype")
    kv_cache_dtype: KVCacheDtype = from_setting(RooflineCostModel, "kv_cache_dtype")
    # The factors (engine/roofline.py RooflineParams declares them); null: the GPU's measured one, else the default.
    host_overhead_ms: float | None = from_setting(RooflineParams, "host_overhead_ms", default=None)
    host_per_seq_us: float | None = from_setting(RooflineParams, "host_per_seq_us", default=None)
    host_per_token_us: float | None = from_setting(RooflineParams, "host_per_token_us", default=None)
    host_overlap: float | None = from_setting(RooflineParams, "host_overlap", default=None)
    compute_efficiency: float | None = from_setting(RooflineParams, "compute_efficiency", default=None)
    moe_compute_efficiency: float | None = from_setting(RooflineParams, "moe_compute_efficiency", default=None)
    attention_efficiency: float | None = from_setting(RooflineParams, "attention_efficiency", default=None)
    memory_efficiency: float | None = from_setting(RooflineParams, "memory_efficiency", default=None)
    kv_memory_efficiency: float | None = from_setting(RooflineParams, "kv_memory_efficiency", default=None)
    collective_latency_us: float | None = from_setting(RooflineParams, "collective_latency_us", default=None)
    moe_layer_us: float | None = from_setting(RooflineParams, "moe_layer_us", default=None)

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
    proxy on both runtimes: requests on one queue, each node's output batches on one queue per node."""

    # A preset of engine/data/front_end.json ("off": none).
    preset: str = Field(DEFAULT_FRONT_END, min_length=1, max_length=100)
    # Overrides of the preset's terms (engine/front_end.py declares them); unset (null) keeps the preset's.
    request_ms: float | None = from_setting(FrontEndParams, "request_ms", default=None)
    prompt_token_us: float | None = from_setting(FrontEndParams, "prompt_token_us", default=None)
    output_token_us: float | None = from_setting(FrontEndParams, "output_token_us", default=None)
    ipc_ms: float | None = from_setting(FrontEndParams, "ipc_ms", default=None)

    @model_validator(mode="after")
    def _known_preset(self) -> FrontEndSettings:
        self.params()  # an unknown preset names the allowed ones
        return self

    def params(self) -> FrontEndParams:
        overrides = {k: v for k, v in self.model_dump(exclude={"preset"}).items() if v is not None}
        return front_end_params(self.preset, **overrides)


def load_preset_file(path: str, how: str) -> dict:
    """A preset file (`disagg-sim calibrate` writes them): JSON, a cost model mapping. `how` says
    what a relative name was taken relative to (cluster/settings_base.py `scenario_relative`)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as err:
        raise ValueError(
            f"cannot read the preset file at {path} ({how}): {err.strerror or err}; allowed: a JSON file"
        ) from None
    except ValueError as err:
        raise ValueError(f"the preset file at {path} is not JSON ({err}); allowed: a JSON file") from None
    if not isinstance(data, dict):
        raise ValueError(f"the preset file at {path} holds {type(data).__name__}; allowed: a mapping")
    return data
