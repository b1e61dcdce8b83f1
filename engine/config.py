"""Typed, validated engine configuration, shaped like the parts of vLLM's
`SchedulerConfig`, `CacheConfig`, `ParallelConfig`, `KVTransferConfig` and
`VllmConfig` that the scheduler reads. Validated once, here, with errors that
name the field and the allowed values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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


def _require(cond: bool, field_name: str, value: object, allowed: str) -> None:
    if not cond:
        raise ValueError(f"{field_name}={value!r} is invalid; allowed: {allowed}")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: SchedulingPolicy = "fcfs"
    async_scheduling: bool = False
    # vLLM 0.33.0 default: admit a waiting request only if its whole current
    # sequence fits in the free blocks.
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    preemption_guard: PreemptionGuard = "fixed"
    # None = vLLM's gate (consumer-capable role and depth > 1); True/False force it,
    # the way vLLM's own tests set `scheduler.defer_block_free` by hand.
    defer_block_free: bool | None = None
    # The release the node models (one of MODELLED_VLLM_VERSIONS; they behave alike).
    vllm_version: str = MODELLED_VLLM_VERSIONS[-1]

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, "an integer >= 1")
        _require(
            self.max_num_batched_tokens >= 1, "max_num_batched_tokens", self.max_num_batched_tokens, "an integer >= 1"
        )
        _require(self.max_model_len >= 1, "max_model_len", self.max_model_len, "an integer >= 1")
        _require(
            self.long_prefill_token_threshold >= 0,
            "long_prefill_token_threshold",
            self.long_prefill_token_threshold,
            "an integer >= 0",
        )
        _require(self.policy in ("fcfs", "priority"), "policy", self.policy, "'fcfs' or 'priority'")
        _require(0.0 <= self.watermark < 1.0, "watermark", self.watermark, "a fraction in [0, 1)")
        _require(
            self.preemption_guard in ("fixed", "prefix"),
            "preemption_guard",
            self.preemption_guard,
            "'fixed' (PR #49675) or 'prefix' (pre-fix cascade)",
        )
        _require(
            self.vllm_version in MODELLED_VLLM_VERSIONS,
            "vllm_version",
            self.vllm_version,
            ", ".join(repr(v) for v in MODELLED_VLLM_VERSIONS)
            + " (0.29.0-0.32.0 schedule differently, see docs/deviations.md 'v1: releases';"
            " preemption_guard='prefix' is 0.29.0's retry without the cascade fix)",
        )
        _require(
            self.defer_block_free in (None, True, False),
            "defer_block_free",
            self.defer_block_free,
            "null (auto gate), true or false",
        )


@dataclass
class CacheConfig:
    num_gpu_blocks: int = 1024
    block_size: int = 16
    # vLLM 0.33.0's default: on (engine/block_pool.py, kv_cache_manager.py).
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _require(
            self.num_gpu_blocks >= 2,
            "num_gpu_blocks",
            self.num_gpu_blocks,
            "an integer >= 2 (one block is the reserved null block)",
        )
        _require(self.block_size >= 1, "block_size", self.block_size, "an integer >= 1")


@dataclass
class ParallelConfig:
    pipeline_parallel_size: int = 1

    def __post_init__(self) -> None:
        _require(
            self.pipeline_parallel_size >= 1, "pipeline_parallel_size", self.pipeline_parallel_size, "an integer >= 1"
        )


@dataclass
class KVTransferConfig:
    kv_role: KVRole = "kv_both"
    # vLLM 0.33.0: with a connector the default policy is "fail".
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail"
    engine_id: str = "engine-0"

    def __post_init__(self) -> None:
        _require(
            self.kv_role in ("kv_producer", "kv_consumer", "kv_both"),
            "kv_role",
            self.kv_role,
            "'kv_producer', 'kv_consumer' or 'kv_both'",
        )
        _require(
            self.kv_load_failure_policy in ("fail", "recompute"),
            "kv_load_failure_policy",
            self.kv_load_failure_policy,
            "'fail' or 'recompute'",
        )

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
