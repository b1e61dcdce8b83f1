"""The topology both runtimes build: node groups with engine settings, links
and their impairments, the cost model, routing. Validated once (pydantic),
with errors that name the field and the allowed values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from connector.kv_timing import NO_KV_TIMING, KVTransferTiming
from connector.link import LinkSpec
from connector.pull_policy import KVFaultPolicy
from engine.block_hash import prompt_block_hashes
from engine.config import MODELLED_VLLM_VERSIONS, CacheConfig, SchedulerConfig
from engine.cost_model import COST_MODELS, StepCostModel, cost_model_names, get_cost_model
from engine.front_end import DEFAULT_FRONT_END, FrontEnd, FrontEndParams, front_end_params
from engine.node_core import NodeSpec
from engine.prompt import PromptTokens
from engine.roofline import RooflineCostModel
from engine.v0.config import SchedulerConfig as V0SchedulerConfig
from node.settings import NodeSettings
from proxy.ports import ProxySettings
from proxy.timeline import ProxyTimeline

from .kv_transfer import KVTransferSettings

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


# Upper bounds on sizes and times. They are far above anything a simulation
# of one serving cluster needs and low enough that a typo (an extra few zeros,
# `1e12`, `inf`) is refused at load instead of exhausting memory or stalling
# the event queue mid-run.
MAX_BLOCKS = 1_000_000  # KV blocks per node (an 80 GB GPU holds ~30k 16-token blocks of an 8B model)
MAX_TOKENS = 10_000_000  # max_model_len, token budgets, thresholds
MAX_SEQS = 65_536
MAX_NODES = 64  # per node group
MAX_PP = 64
MAX_LINK_MS = 600_000.0  # ten minutes of one-way delay or jitter
MIN_BANDWIDTH_MBPS = 0.001  # 1 kB/s; slower would make one block take hours
MAX_BANDWIDTH_MBPS = 1e9
MAX_RUN_S = 86_400.0  # a day of run time for timeouts, deadlines, holds
MAX_SEED = 2**32 - 1  # numpy's SeedSequence and the link seeds take non-negative ints


def _int_or_auto(v: object, handler: ValidatorFunctionWrapHandler, low: int, high: int) -> object:
    """One error for an int-or-"auto" field, not one per union branch."""
    if v == "auto":
        return v
    try:
        return handler(v)
    except ValidationError:
        raise ValueError(f"allowed: an int in [{low}, {high}] or 'auto'") from None


class _Strict(BaseModel):
    # allow_inf_nan=False: an infinite or NaN number is never a usable setting
    # (NaN corrupts the event queue's ordering; inf never fires).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class EngineSettings(_Strict):
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
        return _int_or_auto(v, handler, 2, MAX_BLOCKS)

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


class NodeGroup(_Strict):
    count: int = Field(1, ge=0, le=MAX_NODES)
    pp_size: int = Field(1, ge=1, le=MAX_PP)
    engine: EngineSettings = Field(default_factory=EngineSettings)


OutageStart = Annotated[float, Field(ge=0, le=MAX_RUN_S)]
OutageEnd = Annotated[float, Field(gt=0, allow_inf_nan=True)]


class LinkSettings(_Strict):
    delay_ms: float = Field(0.0, ge=0, le=MAX_LINK_MS)
    jitter_ms: float = Field(0.0, ge=0, le=MAX_LINK_MS)
    jitter_distribution: Literal["normal", "uniform"] = "normal"
    bandwidth_MBps: float | None = Field(None, ge=MIN_BANDWIDTH_MBPS, le=MAX_BANDWIDTH_MBPS)
    loss: float = Field(0.0, ge=0, lt=1)
    # (start_s, end_s) run seconds; end_s may be .inf (down for the rest of the run).
    outages: list[tuple[OutageStart, OutageEnd]] = Field(default_factory=list, max_length=10_000)

    @model_validator(mode="after")
    def _outage_windows(self) -> LinkSettings:
        for i, (start, end) in enumerate(self.outages):
            if not start < end:
                raise ValueError(
                    f"outages[{i}]=[{start:g}, {end:g}] is invalid; allowed: [start_s, end_s] with start_s < end_s "
                    "(end_s may be .inf)"
                )
        return self

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
    seed: int = Field(0, ge=0, le=MAX_SEED)
    # Chance that a sampled token is EOS; requests stop there unless ignore_eos.
    stop_probability: float = Field(0.0, ge=0.0, le=1.0)
    ignore_eos: bool = False


class CostModelSettings(_Strict):
    """A custom cost model: a step takes base_ms + per-token terms (engine/cost_model.py)."""

    name: str = Field("custom", min_length=1, max_length=100)
    base_ms: float = Field(ge=0, le=3_600_000)
    prefill_ms_per_token: float = Field(ge=0, le=3_600_000)
    decode_ms_per_token: float = Field(ge=0, le=3_600_000)
    context_ms_per_ktoken: float = Field(ge=0, le=3_600_000)


class RooflineSettings(_Strict):
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


class FrontEndSettings(_Strict):
    """vLLM's API server in front of each engine (engine/front_end.py): per request its parsing, chat template and
    tokenization, per output token its detokenization and streaming, served one at a time (FIFO). Applied by the
    proxy on both runtimes: requests on one queue, each node's output batches on one queue per node."""

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


def _load_preset_file(path: str) -> dict:
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


class NodePlan(NamedTuple):
    """One node of a cluster, as a runtime builds it."""

    role: str  # "prefill" | "decode"
    spec: NodeSpec
    group: NodeGroup


class ClusterSpec(_Strict):
    prefill: NodeGroup = Field(default_factory=lambda: NodeGroup(count=1, engine=EngineSettings()))
    decode: NodeGroup = Field(default_factory=NodeGroup)
    links: LinksSpec = Field(default_factory=LinksSpec)
    # A built-in name (synthetic set or roofline preset), a preset file (*.json,
    # from `disagg-sim calibrate`), linear coefficients, or a roofline mapping.
    cost_model: str | CostModelSettings | RooflineSettings = "synthetic-8b"
    # prefix_aware: to the node the proxy sent the longest prefix of the prompt before.
    routing: Literal["round_robin", "least_loaded", "prefix_aware"] = "round_robin"
    # vLLM's API server in front of the engines (Front end, below).
    front_end: FrontEndSettings = Field(default_factory=FrontEndSettings)
    sampler: SamplerSettings = Field(default_factory=SamplerSettings)
    shadow_kv: bool = True
    # KV payload per token (bytes): small by default; 131072 B is an 8B-class
    # model in fp16 (2 x 32 layers x 8 KV heads x 128 dims x 2 bytes).
    # An int in [1, 16 MiB], or "auto": the cost model's K/V bytes per token
    # (needs a roofline cost model).
    bytes_per_token: Annotated[int, Field(ge=1, le=16 * 2**20)] | Literal["auto"] = 64
    # The KV fault policy (connector/pull_policy.py), in run seconds: virtual
    # in-process, wall (not scaled by time_scale) on Ray.
    kv_pull_timeout_s: float = Field(2.0, gt=0, le=MAX_RUN_S)
    kv_pull_deadline_s: float = Field(10.0, gt=0, le=MAX_RUN_S)
    kv_pull_backoff_initial_s: float = Field(0.02, gt=0, le=MAX_RUN_S)
    kv_pull_backoff_max_s: float = Field(0.5, gt=0, le=MAX_RUN_S)
    max_concurrent_pulls: int = Field(64, ge=1, le=100_000)
    # A producer frees blocks no consumer reported on after this long;
    # default max(120, 6 x kv_pull_deadline_s).
    kv_hold_timeout_s: float | None = Field(None, gt=0, le=MAX_RUN_S)
    # The P/D hand-off's timeline (cluster/kv_transfer.py): the proxy's HTTP
    # legs and the KV connector's terms, from a preset (none, nixl, mooncake,
    # p2pnccl) with any term overridden. Unused without prefill nodes.
    kv_transfer: KVTransferSettings = Field(default_factory=KVTransferSettings)
    # Ray runtime only: wall seconds slept per modelled second of step time.
    time_scale: float = Field(1.0, ge=1e-4, le=1e4)

    @field_validator("cost_model", mode="before")
    @classmethod
    def _known_cost_model(cls, v: object) -> object:
        if isinstance(v, str) and v.endswith(".json"):
            v = _load_preset_file(v)
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
        return _int_or_auto(v, handler, 1, 16 * 2**20)

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
        if self.routing != "prefix_aware":
            return []
        return prompt_block_hashes(PromptTokens.of(request_id, prompt_len, segments), self.decode.engine.block_size)

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
        assert isinstance(self.bytes_per_token, int)  # "auto" is resolved at validation
        return NodeSettings(self.cost(), time_scale, self.bytes_per_token, self.kv_policy(), kv_timing=self.kv_timing())

    def kv_timing(self) -> KVTransferTiming:
        """The KV connector's terms (none without prefill nodes)."""
        if not self.disaggregated:
            return NO_KV_TIMING
        model = self.cost()
        if isinstance(model, RooflineCostModel):
            return self.kv_transfer.timing(model.model.num_hidden_layers, model.tp)
        return self.kv_transfer.timing(None, 1)

    def proxy_settings(self) -> ProxySettings:
        """What the proxy of this cluster routes by (both runtimes)."""
        return ProxySettings(
            prefill=tuple(f"prefill-{i}" for i in range(self.prefill.count)),
            decode=tuple(f"decode-{i}" for i in range(self.decode.count)),
            routing=self.routing,
            ignore_eos=self.sampler.ignore_eos,
            prompt_hashes=self.prompt_hashes,
            timeline=self.kv_transfer.proxy_timeline() if self.disaggregated else ProxyTimeline(),
            # One API server in front of the cluster (a fresh queue per run):
            # parse, chat template and tokenize each request in turn, then IPC.
            front_end=FrontEnd(self.front_end.params()),
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
                            cache=CacheConfig(e.num_gpu_blocks, e.block_size, e.enable_prefix_caching),
                            pipeline_parallel_size=group.pp_size,
                            kv_load_failure_policy=e.kv_load_failure_policy,
                            sampler_seed=self.sampler.seed + run_seed,
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


__all__ = [
    "ClusterSpec",
    "NodePlan",
    "NodeGroup",
    "EngineSettings",
    "LinkSettings",
    "LinksSpec",
    "SamplerSettings",
    "RooflineSettings",
    "FrontEndSettings",
    "COST_MODELS",
]
