"""The topology both runtimes build: node groups with engine settings, links
and their impairments, the cost model, routing. Validated once (pydantic),
with errors that name the field and the allowed values."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from connector.link import LinkSpec
from connector.pull_policy import KVFaultPolicy
from engine.config import CacheConfig, SchedulerConfig
from engine.cost_model import COST_MODELS, CostModel, get_cost_model
from engine.node_core import NodeSpec
from engine.v0.config import SchedulerConfig as V0SchedulerConfig
from node.settings import NodeSettings

# v1 settings with the value that leaves them unused; a v0 node accepts only that.
V1_ONLY_SETTINGS = {
    "long_prefill_token_threshold": 0,
    "policy": "fcfs",
    "async_scheduling": False,
    "preemption_guard": "fixed",
    "fence": "auto",
    "watermark": 0.0,
    "scheduler_reserve_full_isl": True,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineSettings(_Strict):
    engine: Literal["v1", "v0"] = "v1"
    num_gpu_blocks: int = Field(1024, ge=2)
    block_size: int = Field(16, ge=1)
    max_num_seqs: int = Field(128, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    max_model_len: int = Field(8192, ge=1)
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0)
    policy: Literal["fcfs", "priority"] = "fcfs"
    async_scheduling: bool = False
    preemption_guard: Literal["fixed", "prefix"] = "fixed"
    # "auto" = vLLM's gate; "on"/"off" force it.
    fence: Literal["auto", "on", "off"] = "auto"
    watermark: float = Field(0.0, ge=0.0, lt=1.0)
    scheduler_reserve_full_isl: bool = True
    kv_load_failure_policy: Literal["recompute", "fail"] = "recompute"
    # v0 only: CPU swap space in blocks and the preemption mode ("auto" is
    # vLLM 0.5.3's: recompute for one-sequence requests, which all of ours are).
    num_cpu_blocks: int = Field(0, ge=0)
    preemption_mode: Literal["auto", "recompute", "swap"] = "auto"

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
        )


class NodeGroup(_Strict):
    count: int = Field(1, ge=0)
    pp_size: int = Field(1, ge=1)
    engine: EngineSettings = Field(default_factory=EngineSettings)


class LinkSettings(_Strict):
    delay_ms: float = Field(0.0, ge=0)
    jitter_ms: float = Field(0.0, ge=0)
    jitter_distribution: Literal["normal", "uniform"] = "normal"
    bandwidth_MBps: float | None = Field(None, gt=0)
    loss: float = Field(0.0, ge=0, lt=1)
    outages: list[tuple[float, float]] = Field(default_factory=list)

    def to_spec(self) -> LinkSpec:
        return LinkSpec(
            delay_ms=self.delay_ms,
            jitter_ms=self.jitter_ms,
            jitter_distribution=self.jitter_distribution,
            bandwidth_MBps=self.bandwidth_MBps,
            loss=self.loss,
            outages=tuple(self.outages),
        )


class LinksSpec(_Strict):
    proxy: LinkSettings = Field(default_factory=LinkSettings)
    kv: LinkSettings = Field(default_factory=LinkSettings)
    stage: LinkSettings = Field(default_factory=LinkSettings)


class SamplerSettings(_Strict):
    seed: int = 0
    # Chance that a sampled token is EOS; requests stop there unless ignore_eos.
    stop_probability: float = Field(0.0, ge=0.0, le=1.0)
    ignore_eos: bool = False


class ClusterSpec(_Strict):
    prefill: NodeGroup = Field(default_factory=lambda: NodeGroup(count=1, engine=EngineSettings()))
    decode: NodeGroup = Field(default_factory=NodeGroup)
    links: LinksSpec = Field(default_factory=LinksSpec)
    cost_model: str | dict = "synthetic-8b"
    routing: Literal["round_robin", "least_loaded"] = "round_robin"
    sampler: SamplerSettings = Field(default_factory=SamplerSettings)
    shadow_kv: bool = True
    # KV payload per token (bytes): small by default; 131072 B is an 8B-class
    # model in fp16 (2 x 32 layers x 8 KV heads x 128 dims x 2 bytes).
    bytes_per_token: int = Field(64, ge=1)
    # The KV fault policy (connector/pull_policy.py), in run seconds: virtual
    # in-process, wall (not scaled by time_scale) on Ray.
    kv_pull_timeout_s: float = Field(2.0, gt=0)
    kv_pull_deadline_s: float = Field(10.0, gt=0)
    kv_pull_backoff_initial_s: float = Field(0.02, gt=0)
    kv_pull_backoff_max_s: float = Field(0.5, gt=0)
    max_concurrent_pulls: int = Field(64, ge=1)
    # A producer frees blocks no consumer reported on after this long;
    # default max(120, 6 x kv_pull_deadline_s).
    kv_hold_timeout_s: float | None = Field(None, gt=0)
    # Ray runtime only: wall seconds slept per modelled second of step time.
    time_scale: float = Field(1.0, gt=0)

    @field_validator("cost_model")
    @classmethod
    def _known_cost_model(cls, v):
        get_cost_model(v)  # raises with the allowed names
        return v

    @field_validator("decode")
    @classmethod
    def _at_least_one_decode(cls, v: NodeGroup) -> NodeGroup:
        if v.count < 1:
            raise ValueError(f"decode.count={v.count} is invalid; allowed: >= 1 (decode nodes serve every request)")
        return v

    @model_validator(mode="after")
    def _v0_nodes_are_aggregated(self) -> ClusterSpec:
        for role, group in (("prefill", self.prefill), ("decode", self.decode)):
            if group.count and group.engine.engine == "v0":
                if self.disaggregated:
                    raise ValueError(
                        f"{role}.engine.engine='v0' is invalid in a disaggregated topology (prefill.count="
                        f"{self.prefill.count}); allowed: engine v0 with prefill.count 0 (v0 nodes "
                        "serve whole requests, without a KV connector)"
                    )
                if group.pp_size != 1:
                    raise ValueError(
                        f"{role}.pp_size={group.pp_size} is invalid with engine v0; allowed: 1 (the v0 "
                        "engine runs one step at a time)"
                    )
        if self.kv_pull_backoff_max_s < self.kv_pull_backoff_initial_s:
            raise ValueError(
                f"kv_pull_backoff_max_s={self.kv_pull_backoff_max_s} is invalid; allowed: >= "
                f"kv_pull_backoff_initial_s ({self.kv_pull_backoff_initial_s})"
            )
        return self

    @property
    def disaggregated(self) -> bool:
        return self.prefill.count > 0

    def cost(self) -> CostModel:
        return get_cost_model(self.cost_model)

    def kv_policy(self) -> KVFaultPolicy:
        hold = self.kv_hold_timeout_s if self.kv_hold_timeout_s is not None else max(120.0, 6 * self.kv_pull_deadline_s)
        try:
            return KVFaultPolicy(
                attempt_timeout_s=self.kv_pull_timeout_s,
                deadline_s=self.kv_pull_deadline_s,
                backoff_initial_s=self.kv_pull_backoff_initial_s,
                backoff_max_s=self.kv_pull_backoff_max_s,
                hold_timeout_s=hold,
                max_concurrent_pulls=self.max_concurrent_pulls,
            )
        except ValueError as err:
            raise ValueError(f"cluster: {err}") from None

    def node_settings(self, time_scale: float = 1.0) -> NodeSettings:
        """What every node of this cluster runs with (`time_scale` 1: the virtual clock)."""
        return NodeSettings(self.cost(), time_scale, self.bytes_per_token, self.kv_policy())

    def node_specs(self) -> list[tuple[str, NodeSpec, NodeGroup]]:
        """(role, spec, group) for every node: prefill-0.., decode-0.."""
        out = []
        disagg = self.disaggregated
        for role, group, kv_role in (("prefill", self.prefill, "kv_producer"), ("decode", self.decode, "kv_consumer")):
            for i in range(group.count):
                e = group.engine
                out.append(
                    (
                        role,
                        NodeSpec(
                            name=f"{role}-{i}",
                            kv_role=kv_role if disagg else None,
                            scheduler=e.scheduler_config(),
                            cache=CacheConfig(e.num_gpu_blocks, e.block_size),
                            pipeline_parallel_size=group.pp_size,
                            kv_load_failure_policy=e.kv_load_failure_policy,
                            sampler_seed=self.sampler.seed,
                            stop_probability=self.sampler.stop_probability,
                            shadow_kv=self.shadow_kv,
                            engine=e.engine,
                            num_cpu_blocks=e.num_cpu_blocks,
                            preemption_mode=e.v0_preemption_mode,
                        ),
                        group,
                    )
                )
        return out


__all__ = ["ClusterSpec", "NodeGroup", "EngineSettings", "LinkSettings", "LinksSpec", "SamplerSettings", "COST_MODELS"]
