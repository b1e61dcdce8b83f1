"""Configuration of the legacy v0 scheduler, shaped like vLLM 0.5.3.post1's
`SchedulerConfig` and `CacheConfig` (`vllm/config.py`).

Only what the scheduler and its v1 block manager read, with vLLM 0.5.3's own
defaults. Each value's type and bounds are the scenario schema's to check (a
node's settings are declared on the v1 classes, engine/setting.py); what stays
here is vLLM's own `_verify_args` (e.g. without chunked prefill the token
budget must cover `max_model_len`), with errors that name what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM 0.5.3's `_GB`: swap space is given in GiB.
_GIB = 1 << 30

# The v1 block manager's default watermark (`BlockSpaceManagerV1(watermark=0.01)`).
DEFAULT_WATERMARK = 0.01


def _require(cond: bool, field_name: str, value: object, allowed: str) -> None:
    if not cond:
        raise ValueError(f"{field_name}={value!r} is invalid; allowed: {allowed}")


@dataclass
class SchedulerConfig:
    """`max_num_batched_tokens=None` takes vLLM's default: 512 with chunked
    prefill, else `max(max_model_len, 2048)`. `preemption_mode`: None (auto:
    RECOMPUTE for a one-sequence group, which is every group here), "swap" or
    "recompute" (vLLM treats any other string as recompute; the scenario schema refuses it)."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 256
    max_model_len: int = 2048
    enable_chunked_prefill: bool = False
    preemption_mode: str | None = None

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = 512 if self.enable_chunked_prefill else max(self.max_model_len, 2048)
        # vLLM's SchedulerConfig._verify_args, same two rules.
        if self.max_num_batched_tokens < self.max_model_len and not self.enable_chunked_prefill:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than max_model_len "
                f"({self.max_model_len}) with enable_chunked_prefill=false; allowed: max_num_batched_tokens >= "
                "max_model_len, or enable chunked prefill (vLLM 0.5.3 rejects this configuration)"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs})"
            )

    @property
    def chunked_prefill_enabled(self) -> bool:
        return self.enable_chunked_prefill


@dataclass
class CacheConfig:
    """The KV pools in blocks. `num_cpu_blocks` is the swap space (0 = none);
    `num_cpu_blocks_for_swap_space` converts vLLM's `--swap-space` GiB."""

    num_gpu_blocks: int
    num_cpu_blocks: int = 0
    block_size: int = 16
    watermark: float = DEFAULT_WATERMARK

    @staticmethod
    def num_cpu_blocks_for_swap_space(swap_space_gib: float, cache_block_bytes: int) -> int:
        """vLLM: `int(swap_space_bytes // cache_block_size)`, where one block holds
        `block_size` tokens' K and V over all layers."""
        _require(swap_space_gib >= 0, "swap_space", swap_space_gib, "GiB >= 0")
        _require(cache_block_bytes >= 1, "cache_block_bytes", cache_block_bytes, "bytes >= 1")
        return int((swap_space_gib * _GIB) // cache_block_bytes)
