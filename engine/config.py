"""Typed engine configuration, shaped like the parts of vLLM's
`SchedulerConfig`, `CacheConfig`, `ParallelConfig`, `KVTransferConfig` and
`VllmConfig` that the scheduler reads. The settings a scenario gives are
declared here, once (`setting()`), and validated once, by the scenario
schema derived from these declarations (cluster/engine_settings.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .setting import MAX_BLOCKS, MAX_SEQS, MAX_TOKENS, setting

SchedulingPolicy = Literal["fcfs", "priority"]
KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]
# The two behaviours of the preemption retry under the fence:
#   "fixed"  - vLLM PR #49675 (0.30.0+): stop the retry at a fenced victim.
#   "prefix" - the pre-fix behaviour: preempt the fenced victim anyway, which
#              frees nothing and cascades down the running queue (#49674).
PreemptionGuard = Literal["fixed", "prefix"]
# The vLLM releases whose v1 scheduler this engine models: those that equal
# 0.33.0 step for step on the conformance scenarios (plain, prefix caching,
# P/D). Checked with tests/conformance/compare_releases.py: 0.29.0, 0.30.0 and
# 0.32.0 each differ from 0.33.0 (docs/deviations.md, "v1: releases"), so only
# 0.33.0 is listed; 0.29.0's retry without the cascade fix alone is
# `preemption_guard="prefix"`.
MODELLED_VLLM_VERSIONS = ("0.33.0",)


def check_vllm_version(version: str) -> None:
    """The one rule for `vllm_version`, with its one message."""
    if version not in MODELLED_VLLM_VERSIONS:
        raise ValueError(
            f"vllm_version={version!r} is invalid; allowed: "
            + ", ".join(repr(v) for v in MODELLED_VLLM_VERSIONS)
            + " (0.29.0-0.32.0 schedule differently, see docs/deviations.md 'v1: releases';"
            " preemption_guard='prefix' is 0.29.0's retry without the cascade fix)"
        )


# Each setting below is declared once (engine/setting.py): the scenario schema
# derives its field from the declaration and validates it; these classes
# trust the values they are built with.


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = setting(128, doc="Requests running at once (vLLM --max-num-seqs)", ge=1, le=MAX_SEQS)
    max_num_batched_tokens: int = setting(
        8192, doc="Tokens scheduled per step (vLLM --max-num-batched-tokens)", ge=1, le=MAX_TOKENS
    )
    max_model_len: int = setting(
        8192, doc="Longest sequence, prompt and output (vLLM --max-model-len)", ge=1, le=MAX_TOKENS
    )
    enable_chunked_prefill: bool = setting(True, doc="Split long prompts over steps (vLLM --enable-chunked-prefill)")
    long_prefill_token_threshold: int = setting(
        0, doc="A prompt chunk's token cap per step; 0: none (vLLM --long-prefill-token-threshold)", ge=0, le=MAX_TOKENS
    )
    policy: SchedulingPolicy = setting("fcfs", doc="Waiting-queue order (vLLM --scheduling-policy)")
    async_scheduling: bool = setting(False, doc="Schedule the next step while one runs: one more batch in flight")
    scheduler_reserve_full_isl: bool = setting(
        True,
        doc="vLLM 0.33.0's default: admit a waiting request only if its whole current sequence fits in the "
        "free blocks.",
    )
    watermark: float = setting(0.0, doc="Share of blocks kept free at admission", ge=0.0, lt=1.0)
    preemption_guard: PreemptionGuard = setting(
        "fixed",
        doc='The preemption retry under the fence: "fixed" (vLLM PR #49675) or "prefix" (the pre-fix cascade, #49674)',
    )
    # None = vLLM's gate (consumer-capable role and depth > 1); True/False force it,
    # the way vLLM's own tests set `scheduler.defer_block_free` by hand. The
    # scenario's `fence` setting ("auto", "on", "off") says which.
    defer_block_free: bool | None = None
    vllm_version: str = setting(
        MODELLED_VLLM_VERSIONS[-1],
        doc="The vLLM release the v1 engine models (engine/config.py MODELLED_VLLM_VERSIONS).",
        check=check_vllm_version,
    )


@dataclass(frozen=True)
class CacheConfig:
    num_gpu_blocks: int = setting(
        1024,
        doc='An int in [2, 1000000], or "auto": sized from GPU memory as vLLM does (needs a roofline cost model).',
        ge=2,
        le=MAX_BLOCKS,
    )
    block_size: int = setting(16, doc="Tokens per KV block", ge=1, le=1024)
    enable_prefix_caching: bool = setting(
        True,
        doc="Automatic prefix caching, on by default as in vLLM 0.33.0 (v1 only: the v0 engine models 0.5.3 "
        "with caching off, its default).",
    )


@dataclass(frozen=True)
class ParallelConfig:
    # NodeSpec.pipeline_parallel_size declares the setting.
    pipeline_parallel_size: int = 1


@dataclass(frozen=True)
class KVTransferConfig:
    kv_role: KVRole
    # A node's setting, NodeSpec.kv_load_failure_policy, declares it (vLLM
    # 0.33.0's own default with a connector is "fail"; the scenario's is "recompute").
    kv_load_failure_policy: Literal["fail", "recompute"]
    engine_id: str = "engine-0"

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")


@dataclass
class VllmConfig:
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer_config: KVTransferConfig | None = None

    @property
    def max_concurrent_batches(self) -> int:
        """Batch-queue depth (`cfg/vllm.py:588-598`): pp_size, +1 with async
        scheduling (the V2 runner's rule; on the V1 runner async only runs at
        pp_size 1, where both rules give 2)."""
        pp = self.parallel_config.pipeline_parallel_size
        return pp + 1 if self.scheduler_config.async_scheduling else pp
