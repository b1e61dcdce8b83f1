"""A model's shape from its Hugging Face `config.json` fields, and a GPU's
datasheet figures: what the roofline cost model (engine/roofline.py) needs.

The shipped sets live in `engine/data/models.json` and `engine/data/gpus.json`,
each entry with the URL its numbers were copied from (docs/cost-model.md).
Reading them is the only I/O here: files next to this module, read on first use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from pathlib import Path

# The package's folder, not this file's: a compiled build (docs/compiled.md)
# loads this module from build/compiled/, where there is no data.
DATA_DIR = Path(str(resources.files("engine"))) / "data"

# config.json's `layer_types` entries the roofline prices (engine/roofline.py).
LAYER_TYPES = ("full_attention", "sliding_attention")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "float8_e4m3fn": 1}


def _check_positive(owner: str, name: str, value: object, kind: type = int) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if kind is int:
        ok = ok and isinstance(value, int)
    if not ok:
        allowed = "an int >= 1" if kind is int else "a number > 0"
        raise ValueError(f"{owner}: {name}={value!r} is invalid; allowed: {allowed}")


@dataclass(frozen=True)
class ModelShape:
    """The config.json fields that decide a step's FLOPs and bytes."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size / num_attention_heads, as transformers does
    torch_dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    # Mixture of experts (Qwen-MoE names; Mixtral's num_local_experts is accepted too).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    # Sliding-window attention (gpt-oss: every even layer attends to the last
    # 128 tokens only, vLLM's gpt_oss.py `OAIAttention`): the window and each
    # layer's type as config.json lists them ("sliding_attention" /
    # "full_attention"). Without `layer_types` every layer is full attention.
    sliding_window: int = 0
    layer_types: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        owner = f"model {self.name!r}"
        for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads"):
            _check_positive(owner, name, getattr(self, name))
        for name in ("intermediate_size", "vocab_size"):
            _check_positive(owner, name, getattr(self, name))
        if self.torch_dtype not in DTYPE_BYTES:
            raise ValueError(f"{owner}: torch_dtype={self.torch_dtype!r} is invalid; allowed: {sorted(DTYPE_BYTES)}")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"{owner}: num_experts_per_tok={self.num_experts_per_tok!r} is invalid; allowed: "
                    f"1..num_experts ({self.num_experts})"
                )
            _check_positive(owner, "moe_intermediate_size", self.moe_intermediate_size or self.intermediate_size)
        if self.layer_types:
            bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if bad or len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(
                    f"{owner}: layer_types={list(self.layer_types)!r} is invalid; allowed: num_hidden_layers "
                    f"({self.num_hidden_layers}) entries of {list(LAYER_TYPES)}"
                )
            if self.num_sliding_layers:
                _check_positive(owner, "sliding_window", self.sliding_window)

    @classmethod
    def from_config(cls, name: str, config: dict) -> ModelShape:
        """From a config.json's fields (unknown keys are ignored, as a config carries many)."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in config.items() if k in known}
        if "num_local_experts" in config and "num_experts" not in data:  # Mixtral
            data["num_experts"] = config["num_local_experts"]
        if "num_experts" in data and "moe_intermediate_size" not in data:
            data["moe_intermediate_size"] = config.get("intermediate_size", 0)
        missing = [
            f
            for f in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "intermediate_size",
                "vocab_size",
            )
            if f not in data
        ]
        if missing:
            raise ValueError(f"model {name!r}: config is missing {missing}; allowed: a Hugging Face config.json")
        data.pop("name", None)
        if "layer_types" in data:
            data["layer_types"] = tuple(data["layer_types"])
        if data.get("sliding_window") is None:  # config.json writes null where there is none
            data.pop("sliding_window", None)
        return cls(name=name, **data)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.torch_dtype]

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def num_sliding_layers(self) -> int:
        """Layers whose attention reads at most `sliding_window` tokens back."""
        return sum(t == "sliding_attention" for t in self.layer_types)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attn_params_per_layer(self) -> int:
        h, d = self.hidden_size, self.head_size
        q = h * self.num_attention_heads * d
        kv = 2 * h * self.num_key_value_heads * d
        o = self.num_attention_heads * d * h
        return q + kv + o

    @property
    def expert_params(self) -> int:
        """One expert's (or the dense MLP's) gate, up and down projections."""
        inter = self.moe_intermediate_size if self.is_moe else self.intermediate_size
        return 3 * self.hidden_size * inter

    @property
    def mlp_params_per_layer(self) -> int:
        if self.is_moe:
            return self.num_experts * self.expert_params + self.hidden_size * self.num_experts  # + router
        return self.expert_params

    @property
    def embedding_params(self) -> int:
        n = self.vocab_size * self.hidden_size
        return n if self.tie_word_embeddings else 2 * n

    @property
    def num_params(self) -> int:
        norms = (2 * self.num_hidden_layers + 1) * self.hidden_size  # two RMSNorms per layer and the final one
        layers = self.num_hidden_layers * (self.attn_params_per_layer + self.mlp_params_per_layer)
        return layers + self.embedding_params + norms

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token: what a KV handoff moves per token."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_size * self.dtype_bytes


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet figures of one GPU (dense BF16; bandwidths in GB/s = 1e9 B/s)."""

    name: str
    bf16_tflops: float
    memory_bandwidth_GBps: float
    memory_GB: float
    # Per direction, to each peer: what a ring all-reduce's steps run at.
    interconnect_GBps: float
    source: str = ""
    # Dense FP8 tensor TFLOPS; 0: no FP8 tensor cores (Ampere), where vLLM's
    # FP8 checkpoints run weight-only FP8 kernels at the BF16 peak.
    fp8_tflops: float = 0.0
    # The architecture (hopper, ampere, ada, blackwell, cdna3): the validation
    # fits efficiency factors per class, so a GPU without published runs of its
    # own can take its class's (docs/cost-model.md).
    gpu_class: str = ""
    # Roofline efficiency factors measured for this GPU (engine/roofline.py's
    # RooflineParams fields), used where a cost model does not give its own;
    # the shipped ones are fitted on published runs (docs/validation.md).
    # (field, value) pairs: a tuple keeps the spec hashable.
    efficiency: tuple[tuple[str, float], ...] = ()
    efficiency_source: str = ""

    def __post_init__(self) -> None:
        for name in ("bf16_tflops", "memory_bandwidth_GBps", "memory_GB", "interconnect_GBps"):
            _check_positive(f"gpu {self.name!r}", name, getattr(self, name), float)
        v = self.fp8_tflops
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"gpu {self.name!r}: fp8_tflops={v!r} is invalid; allowed: a number >= 0 (0: none)")

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor TFLOPS of the GEMMs for weights of `dtype` ("fp8" or 16-bit)."""
        if dtype == "fp8" and self.fp8_tflops > 0:
            return self.fp8_tflops
        return self.bf16_tflops

    @classmethod
    def from_dict(cls, name: str, data: dict) -> GPUSpec:
        known = {f.name for f in fields(cls)} - {"name"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"gpu {name!r}: unknown field(s) {sorted(unknown)}; allowed: {sorted(known)}")
        data = dict(data)
        efficiency = data.pop("efficiency", {})
        if not isinstance(efficiency, dict):
            raise ValueError(f"gpu {name!r}: efficiency must be a mapping of roofline factors, got {efficiency!r}")
        return cls(name=name, efficiency=tuple(sorted(efficiency.items())), **data)


@cache
def _load(file: str) -> dict[str, dict]:
    with open(DATA_DIR / file, encoding="utf-8") as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def shipped_models() -> dict[str, dict]:
    return _load("models.json")


def shipped_gpus() -> dict[str, dict]:
    return _load("gpus.json")


def shipped_presets() -> dict[str, dict]:
    return _load("presets.json")


def get_model(name_or_config: str | dict) -> ModelShape:
    if isinstance(name_or_config, dict):
        return ModelShape.from_config(str(name_or_config.get("name", "custom")), name_or_config)
    models = shipped_models()
    if name_or_config not in models:
        raise ValueError(f"model={name_or_config!r} is unknown; allowed: {sorted(models)} or config.json fields")
    return ModelShape.from_config(name_or_config, models[name_or_config])


def get_gpu(name_or_spec: str | dict) -> GPUSpec:
    if isinstance(name_or_spec, dict):
        spec = dict(name_or_spec)
        return GPUSpec.from_dict(str(spec.pop("name", "custom")), spec)
    gpus = shipped_gpus()
    if name_or_spec not in gpus:
        raise ValueError(f"gpu={name_or_spec!r} is unknown; allowed: {sorted(gpus)} or a mapping of its figures")
    return GPUSpec.from_dict(name_or_spec, gpus[name_or_spec])
