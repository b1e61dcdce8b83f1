"""A node group's settings in a scenario: how many nodes, their pipeline
depth, and the engine each runs (`cluster.{prefill,decode}.engine`), plus
the sampler every node shares (`cluster.sampler`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidatorFunctionWrapHandler, field_validator, model_validator

from engine.config import MODELLED_VLLM_VERSIONS, CacheConfig, PreemptionGuard, SchedulerConfig, SchedulingPolicy
from engine.node_core import NodeSpec
from engine.v0.config import SchedulerConfig as V0SchedulerConfig

from .routing_settings import RoutingPolicy
from .settings_base import MAX_NODES, MAX_SEED, StrictModel, from_setting, int_or_auto, settings_for

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
    """One node group's engine. Each setting is declared once on the engine
    class that uses it (`SchedulerConfig`, `CacheConfig`, `NodeSpec`) and
    derived here (`from_setting`): bounds, defaults and docs come from there."""

    engine: Literal["v1", "v0"] = from_setting(NodeSpec, "engine")
    num_gpu_blocks: int | Literal["auto"] = from_setting(CacheConfig, "num_gpu_blocks", bounds=False)
    # With num_gpu_blocks "auto": the share of GPU memory vLLM may use.
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    block_size: int = from_setting(CacheConfig, "block_size")
    max_num_seqs: int = from_setting(SchedulerConfig, "max_num_seqs")
    max_num_batched_tokens: int = from_setting(SchedulerConfig, "max_num_batched_tokens")
    max_model_len: int = from_setting(SchedulerConfig, "max_model_len")
    enable_chunked_prefill: bool = from_setting(SchedulerConfig, "enable_chunked_prefill")
    long_prefill_token_threshold: int = from_setting(SchedulerConfig, "long_prefill_token_threshold")
    policy: SchedulingPolicy = from_setting(SchedulerConfig, "policy")
    async_scheduling: bool = from_setting(SchedulerConfig, "async_scheduling")
    preemption_guard: PreemptionGuard = from_setting(SchedulerConfig, "preemption_guard")
    vllm_version: str = from_setting(SchedulerConfig, "vllm_version")
    # "auto" = vLLM's gate; "on"/"off" force it (SchedulerConfig.defer_block_free).
    fence: Literal["auto", "on", "off"] = "auto"
    watermark: float = from_setting(SchedulerConfig, "watermark")
    scheduler_reserve_full_isl: bool = from_setting(SchedulerConfig, "scheduler_reserve_full_isl")
    kv_load_failure_policy: Literal["recompute", "fail"] = from_setting(NodeSpec, "kv_load_failure_policy")
    enable_prefix_caching: bool = from_setting(CacheConfig, "enable_prefix_caching")
    num_cpu_blocks: int = from_setting(NodeSpec, "num_cpu_blocks")
    preemption_mode: Literal["auto", "recompute", "swap"] = from_setting(NodeSpec, "preemption_mode")

    @field_validator("num_gpu_blocks", mode="wrap")
    @classmethod
    def _blocks_or_auto(cls, v: object, handler: ValidatorFunctionWrapHandler) -> object:
        return int_or_auto(v, handler, CacheConfig, "num_gpu_blocks")

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
        defer_block_free = {"auto": None, "on": True, "off": False}[self.fence]
        return SchedulerConfig(**settings_for(SchedulerConfig, self), defer_block_free=defer_block_free)

    def cache_config(self) -> CacheConfig:
        assert isinstance(self.num_gpu_blocks, int)  # "auto" is resolved at validation (ClusterSpec)
        return CacheConfig(**settings_for(CacheConfig, self))


class NodeGroup(StrictModel):
    count: int = Field(1, ge=0, le=MAX_NODES)
    pp_size: int = from_setting(NodeSpec, "pipeline_parallel_size")
    engine: EngineSettings = Field(default_factory=EngineSettings)
    # How the proxy picks a node of this pool (proxy/routing.py); unset: the cluster's `routing`.
    routing: RoutingPolicy | None = None


class SamplerSettings(StrictModel):
    seed: int = Field(0, ge=0, le=MAX_SEED)
    stop_probability: float = from_setting(NodeSpec, "stop_probability")
    ignore_eos: bool = False
