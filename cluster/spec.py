"""The topology both runtimes build (`cluster:` in a scenario): the node
groups, links, cost model, routing, sampler, P/D hand-off and KV fault
policy, and what each runtime derives from them (node specs, node and proxy
settings). Validated once (pydantic), with errors that name the field and the
allowed values; each part's settings live in their own module
(engine_settings, link_settings, cost_settings, kv_transfer)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Literal, NamedTuple

from pydantic import Field, ValidationInfo, ValidatorFunctionWrapHandler, field_validator, model_validator

from connector.kv_timing import NO_KV_TIMING, KVTransferTiming
from connector.pull_policy import KVFaultPolicy
from engine.block_hash import prompt_block_hashes
from engine.cost_model import StepCostModel, cost_model_names, get_cost_model
from engine.front_end import FrontEnd
from engine.node_core import NodeSpec
from engine.prompt import PromptTokens
from engine.roofline import RooflineCostModel
from node.settings import NodeSettings
from proxy.ports import ProxySettings
from proxy.routing import PREFIX_POLICIES
from proxy.timeline import ProxyTimeline

from .cost_settings import CostModelSettings, FrontEndSettings, RooflineSettings, load_preset_file
from .engine_settings import EngineSettings, NodeGroup, SamplerSettings
from .kv_transfer import KVTransferSettings
from .link_settings import LinksSpec
from .placement_spec import PlacementSpec, TlsMode
from .routing_settings import RoutingPolicy, RoutingWeights
from .settings_base import MAX_BLOCKS, MAX_RUN_S, StrictModel, from_setting, int_or_auto, scenario_relative


def _blocks(group: NodeGroup) -> int:
    blocks = group.engine.num_gpu_blocks
    assert isinstance(blocks, int)  # "auto" is resolved at validation
    return blocks


class NodePlan(NamedTuple):
    """One node of a cluster, as a runtime builds it."""

    role: str  # "prefill" | "decode"
    spec: NodeSpec
    group: NodeGroup


class ClusterSpec(StrictModel):
    prefill: NodeGroup = Field(default_factory=lambda: NodeGroup(count=1, engine=EngineSettings()))
    decode: NodeGroup = Field(default_factory=NodeGroup)
    links: LinksSpec = Field(default_factory=LinksSpec)
    # A built-in name (synthetic set or roofline preset), a preset file (*.json,
    # from `disagg-sim calibrate`), linear coefficients, or a roofline mapping.
    cost_model: str | CostModelSettings | RooflineSettings = "synthetic-8b"
    # Both pools' routing unless a pool sets its own (prefill.routing, decode.routing).
    # prefix_aware: to the node the proxy sent the longest prefix of the prompt before;
    # kv_aware: weighted prefix-hit, queue-depth and KV-usage scores (routing_weights).
    routing: RoutingPolicy = "round_robin"
    routing_weights: RoutingWeights = Field(default_factory=RoutingWeights)
    # vLLM's API server in front of the engines (Front end, below).
    front_end: FrontEndSettings = Field(default_factory=FrontEndSettings)
    sampler: SamplerSettings = Field(default_factory=SamplerSettings)
    shadow_kv: bool = from_setting(NodeSpec, "shadow_kv")
    bytes_per_token: int | Literal["auto"] = from_setting(NodeSettings, "bytes_per_token", bounds=False)
    kv_pull_timeout_s: float = from_setting(KVFaultPolicy, "attempt_timeout_s")
    kv_pull_deadline_s: float = from_setting(KVFaultPolicy, "deadline_s")
    kv_pull_backoff_initial_s: float = from_setting(KVFaultPolicy, "backoff_initial_s")
    kv_pull_backoff_max_s: float = from_setting(KVFaultPolicy, "backoff_max_s")
    max_concurrent_pulls: int = from_setting(KVFaultPolicy, "max_concurrent_pulls")
    # A producer frees blocks no consumer reported on after this long;
    # default max(120, 6 x kv_pull_deadline_s).
    kv_hold_timeout_s: float | None = Field(None, gt=0, le=MAX_RUN_S)
    # The P/D hand-off's timeline (cluster/kv_transfer.py): the proxy's HTTP
    # legs and the KV connector's terms, from a preset (none, nixl, mooncake,
    # p2pnccl) with any term overridden. Unused without prefill nodes.
    kv_transfer: KVTransferSettings = Field(default_factory=KVTransferSettings)
    time_scale: float = from_setting(NodeSettings, "time_scale")
    # Ray runtime only: where node actors go, and TLS on the KV handoff (cluster/placement_spec.py).
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    tls: TlsMode = "auto"

    @field_validator("cost_model", mode="before")
    @classmethod
    def _known_cost_model(cls, v: object, info: ValidationInfo) -> object:
        if isinstance(v, str) and v.endswith(".json"):
            # The scenario file's directory's, as trace.path is; `--set` made it absolute already.
            v = load_preset_file(*scenario_relative(v, info.context))
        if isinstance(v, dict) and ("model" in v or "gpu" in v):
            return RooflineSettings.model_validate(v)  # not the linear branch's errors
        if isinstance(v, str) and v not in cost_model_names():
            get_cost_model(v)  # raises with the allowed names
        return v

    @model_validator(mode="after")
    def _sizes_from_the_model(self) -> ClusterSpec:
        """Resolve "auto" sizes from a roofline cost model, as vLLM sizes its cache."""
        wants = [g for g in (self.prefill, self.decode) if g.engine.num_gpu_blocks == "auto"]
        if not wants and self.bytes_per_token != "auto":
            return self
        model = self.cost()
        if not isinstance(model, RooflineCostModel):
            key = "num_gpu_blocks" if wants else "bytes_per_token"
            raise ValueError(
                f"{key}='auto' needs a roofline cost model; cost_model={model.name!r} is a linear set; allowed: "
                f"a preset such as 'llama-3.1-8b-h100', or an explicit {key}"
            )
        for group in wants:
            e = group.engine
            blocks = model.num_gpu_blocks(
                e.gpu_memory_utilization, e.block_size, e.max_num_batched_tokens, e.max_num_seqs
            )
            e.num_gpu_blocks = min(blocks, MAX_BLOCKS)
        if self.bytes_per_token == "auto":
            self.bytes_per_token = model.kv_bytes_per_token
        return self

    @field_validator("bytes_per_token", mode="wrap")
    @classmethod
    def _bytes_or_auto(cls, v: object, handler: ValidatorFunctionWrapHandler) -> object:
        return int_or_auto(v, handler, NodeSettings, "bytes_per_token")

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

    def cost(self) -> StepCostModel:
        if isinstance(self.cost_model, RooflineSettings):
            return get_cost_model(self.cost_model.roofline_dict())
        if isinstance(self.cost_model, CostModelSettings):
            return get_cost_model(self.cost_model.model_dump())
        return get_cost_model(self.cost_model)

    def prompt_hashes(self, request_id: str, prompt_len: int, segments: Sequence[tuple[int, int]]) -> list[int]:
        """A prompt's block hashes for prefix-aware routing (empty under other policies)."""
        if not any(self.pool_routing(role) in PREFIX_POLICIES for role in ("prefill", "decode")):
            return []
        return prompt_block_hashes(PromptTokens.of(request_id, prompt_len, segments), self.decode.engine.block_size)

    def pool_routing(self, role: str) -> str:
        """The routing policy of the `role` pool."""
        group = self.prefill if role == "prefill" else self.decode
        return group.routing or self.routing

    def kv_policy(self) -> KVFaultPolicy:
        hold = self.kv_hold_timeout_s if self.kv_hold_timeout_s is not None else max(120.0, 6 * self.kv_pull_deadline_s)
        return KVFaultPolicy(
            attempt_timeout_s=self.kv_pull_timeout_s,
            deadline_s=self.kv_pull_deadline_s,
            backoff_initial_s=self.kv_pull_backoff_initial_s,
            backoff_max_s=self.kv_pull_backoff_max_s,
            hold_timeout_s=hold,
            max_concurrent_pulls=self.max_concurrent_pulls,
        )

    def node_settings(self, time_scale: float = 1.0, ticket_key: bytes | None = None) -> NodeSettings:
        """What a node of this cluster runs with (`time_scale` 1: the virtual clock).
        `ticket_key` keys its KV tickets (docs/security.md): the runtime's
        (seeded in-process, derived from the run's secret on Ray); None, for
        nodes built by hand: a fresh random key, so nobody can forge a ticket."""
        assert isinstance(self.bytes_per_token, int)  # "auto" is resolved at validation
        if ticket_key is None:
            ticket_key = secrets.token_bytes(32)
        return NodeSettings(
            self.cost(), time_scale, self.bytes_per_token, self.kv_policy(), ticket_key, kv_timing=self.kv_timing()
        )

    def kv_timing(self) -> KVTransferTiming:
        """The KV connector's terms (none without prefill nodes)."""
        if not self.disaggregated:
            return NO_KV_TIMING
        model = self.cost()
        if isinstance(model, RooflineCostModel):
            return self.kv_transfer.timing(model.model.num_hidden_layers, model.tp)
        return self.kv_transfer.timing(None, 1)

    def proxy_settings(
        self,
        prefill: Sequence[str] | None = None,
        decode: Sequence[str] | None = None,
        time_scale: float = 1.0,
    ) -> ProxySettings:
        """What the proxy of this cluster routes by (both runtimes): over the
        named nodes (default: every node of the spec; a Ray run: its live
        actors), with the timeline's legs and the API server's terms in run
        seconds (`time_scale` wall seconds per modelled second on Ray)."""
        timeline = self.kv_transfer.proxy_timeline() if self.disaggregated else ProxyTimeline()
        return ProxySettings(
            prefill=tuple(prefill if prefill is not None else (f"prefill-{i}" for i in range(self.prefill.count))),
            decode=tuple(decode if decode is not None else (f"decode-{i}" for i in range(self.decode.count))),
            routing=self.routing,
            ignore_eos=self.sampler.ignore_eos,
            prompt_hashes=self.prompt_hashes,
            pool_routing={role: self.pool_routing(role) for role in ("prefill", "decode")},
            score_weights=self.routing_weights.weights(),
            pool_blocks={role: _blocks(g) for role, g in (("prefill", self.prefill), ("decode", self.decode))},
            block_size=self.decode.engine.block_size,
            timeline=timeline.scaled(time_scale) if time_scale != 1.0 else timeline,
            # One API server in front of the cluster (a fresh queue per run):
            # parse, chat template and tokenize each request in turn, then IPC.
            front_end=FrontEnd(self.front_end.params().scaled(time_scale)),
        )

    def node_specs(self, run_seed: int = 0) -> list[NodePlan]:
        """Every node: prefill-0.., decode-0..; the nodes of run `run_seed`
        sample with the sampler's seed + `run_seed`."""
        out = []
        disagg = self.disaggregated
        for role, group, kv_role in (("prefill", self.prefill, "kv_producer"), ("decode", self.decode, "kv_consumer")):
            for i in range(group.count):
                e = group.engine
                assert isinstance(e.num_gpu_blocks, int)  # "auto" is resolved at validation
                out.append(
                    NodePlan(
                        role,
                        NodeSpec(
                            name=f"{role}-{i}",
                            kv_role=kv_role if disagg else None,
                            scheduler=e.scheduler_config(),
                            cache=e.cache_config(),
                            pipeline_parallel_size=group.pp_size,
                            kv_load_failure_policy=e.kv_load_failure_policy,
                            sampler_seed=self.sampler.seed + run_seed,
                            stop_probability=self.sampler.stop_probability,
                            shadow_kv=self.shadow_kv,
                            engine=e.engine,
                            num_cpu_blocks=e.num_cpu_blocks,
                            preemption_mode=e.preemption_mode,
                        ),
                        group,
                    )
                )
        return out


__all__ = ["ClusterSpec", "NodePlan"]
