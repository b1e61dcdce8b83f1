"""A node group's settings in a scenario: how many nodes, their pipeline
depth, and the engine each runs (`cluster.{prefill,decode}.engine`), plus
the sampler every node shares (`cluster.sampler`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidatorFunctionWrapHandler, field_validator, model_validator

from engine.config import MODELLED_VLLM_VERSIONS, SchedulerConfig
from engine.v0.config import SchedulerConfig as V0SchedulerConfig

from .settings_base import MAX_BLOCKS, MAX_NODES, MAX_PP, MAX_SEED, MAX_SEQS, MAX_TOKENS, StrictModel, int_or_auto

# v1 settings with the value that leaves them unused; a v0 node accepts only that.
V1_ONLY_SETTINGS = {
    "long_prefill_token_threshold": 0,
    "policy": "fcfs",
    "async_scheduling": False,
    "preemption_guard": "fixed",
    "fence": "auto",
    "watermark": 0.0,
    "scheduler_reserve_full_isl": True,
    "vllm_version": MODELLED_VLLM_VERSIONS[-1],
}


class EngineSettings(StrictModel):
    engine: Literal["v1", "v0"] = "v1"
    # An int in [2, 1000000], or "auto": sized from GPU memory as vLLM does
    # (needs a roofline cost model).
    num_gpu_blocks: Annotated[int, Field(ge=2, le=MAX_BLOCKS)] | Literal["auto"] = 1024
    # With num_gpu_blocks "auto": the share of GPU memory vLLM may use.
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    block_size: int = Field(16, ge=1, le=1024)
    max_num_seqs: int = Field(128, ge=1, le=MAX_SEQS)
    max_num_batched_tokens: int = Field(8192, ge=1, le=MAX_TOKENS)
    max_model_len: int = Field(8192, ge=1, le=MAX_TOKENS)
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0, le=MAX_TOKENS)
    policy: Literal["fcfs", "priority"] = "fcfs"
    async_scheduling: bool = False
    preemption_guard: Literal["fixed", "prefix"] = "fixed"
    # The vLLM release the v1 engine models (engine/config.py MODELLED_VLLM_VERSIONS).
    vllm_version: str = MODELLED_VLLM_VERSIONS[-1]
    # "auto" = vLLM's gate; "on"/"off" force it.
    fence: Literal["auto", "on", "off"] = "auto"
    watermark: float = Field(0.0, ge=0.0, lt=1.0)
    scheduler_reserve_full_isl: bool = True
    kv_load_failure_policy: Literal["recompute", "fail"] = "recompute"
    # Automatic prefix caching, on by default as in vLLM 0.33.0 (v1 only:
    # the v0 engine models 0.5.3 with caching off, its default).
    enable_prefix_caching: bool = True
    # v0 only: CPU swap space in blocks and the preemption mode ("auto" is
    # vLLM 0.5.3's: recompute for one-sequence requests, which all of ours are).
    num_cpu_blocks: int = Field(0, ge=0, le=MAX_BLOCKS)
    preemption_mode: Literal["auto", "recompute", "swap"] = "auto"

    @field_validator("num_gpu_blocks", mode="wrap")
    @classmethod
    def _blocks_or_auto(cls, v: object, handler: ValidatorFunctionWrapHandler) -> object:
        return int_or_auto(v, handler, 2, MAX_BLOCKS)

    @field_validator("vllm_version")
    @classmethod
    def _modelled_release(cls, v: str) -> str:
        SchedulerConfig(vllm_version=v)  # one rule and one message, the engine's
        return v

    @model_validator(mode="after")
    def _settings_of_the_chosen_engine(self) -> EngineSettings:
        if self.engine == "v1":
            if self.num_cpu_blocks or self.preemption_mode != "auto":
                raise ValueError(
                    f"num_cpu_blocks={self.num_cpu_blocks} / preemption_mode={self.preemption_mode!r} "
                    "are v0 settings; allowed with engine v1: 0 / 'auto'"
                )
            return self
        for name, unused in V1_ONLY_SETTINGS.items():
            if getattr(self, name) != unused:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is a v1 setting; allowed with engine v0: "
                    f"{unused!r} (vLLM 0.5.3's v0 scheduler has no such option)"
                )
        if self.preemption_mode == "swap" and self.num_cpu_blocks == 0:
            raise ValueError(
                "preemption_mode='swap' with num_cpu_blocks=0 is invalid: the first preemption would "
                "abort the engine (vLLM: 'lack of CPU swap space'); allowed: num_cpu_blocks >= 1"
            )
        self.v0_scheduler_config()  # vLLM 0.5.3's own rules, e.g. the token budget vs max_model_len
        return self

    def v0_scheduler_config(self) -> V0SchedulerConfig:
        return V0SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            preemption_mode=self.v0_preemption_mode,
        )

    @property
    def v0_preemption_mode(self) -> str | None:
        return None if self.preemption_mode == "auto" else self.preemption_mode

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            policy=self.policy,
            async_scheduling=self.async_scheduling,
            scheduler_reserve_full_isl=self.scheduler_reserve_full_isl,
            watermark=self.watermark,
            preemption_guard=self.preemption_guard,
            defer_block_free={"auto": None, "on": True, "off": False}[self.fence],
            vllm_version=self.vllm_version,
        )


class NodeGroup(StrictModel):
    count: int = Field(1, ge=0, le=MAX_NODES)
    pp_size: int = Field(1, ge=1, le=MAX_PP)
    engine: EngineSettings = Field(default_factory=EngineSettings)


class SamplerSettings(StrictModel):
    seed: int = Field(0, ge=0, le=MAX_SEED)
    # Chance that a sampled token is EOS; requests stop there unless ignore_eos.
    stop_probability: float = Field(0.0, ge=0.0, le=1.0)
    ignore_eos: bool = False
