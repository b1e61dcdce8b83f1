"""A node's v0 scheduler from the node's settings (`engine.node_core.NodeSpec`
with `engine="v0"`), and the rules that make a v0 node.

vLLM 0.5.3's v0 engine has no KV connector of the P/D kind modelled here, no
batch queue (one step in flight) and no v1-only knobs; asking a v0 node for
any of them is an error that names the setting, not a silent fallback.
"""

from __future__ import annotations

from engine.config import CacheConfig as V1CacheConfig
from engine.config import SchedulerConfig as V1SchedulerConfig
from engine.v0.config import CacheConfig, SchedulerConfig
from engine.v0.engine_adapter import V0SchedulerAdapter

# v1 settings a v0 node cannot honour, with the value that means "unused".
_V1_ONLY_DEFAULTS = {
    "policy": "fcfs",
    "async_scheduling": False,
    "long_prefill_token_threshold": 0,
    "defer_block_free": None,
}


def check_v0_node(name: str, kv_role: str | None, scheduler: V1SchedulerConfig, pipeline_parallel_size: int) -> None:
    if kv_role is not None:
        raise ValueError(
            f"node {name!r}: kv_role={kv_role!r} is invalid for engine v0; allowed: null (v0 nodes "
            "serve whole requests, so only in an aggregated topology: prefill.count 0)"
        )
    if pipeline_parallel_size != 1:
        raise ValueError(
            f"node {name!r}: pipeline_parallel_size={pipeline_parallel_size} is invalid for engine v0; "
            "allowed: 1 (the v0 engine runs one step at a time)"
        )
    for field_name, unused in _V1_ONLY_DEFAULTS.items():
        value = getattr(scheduler, field_name)
        if value != unused:
            raise ValueError(
                f"node {name!r}: {field_name}={value!r} is a v1 setting; allowed with engine v0: "
                f"{unused!r} (vLLM 0.5.3's v0 scheduler has no such option)"
            )


def create_v0_scheduler(
    name: str,
    kv_role: str | None,
    scheduler: V1SchedulerConfig,
    cache: V1CacheConfig,
    pipeline_parallel_size: int = 1,
    num_cpu_blocks: int = 0,
    preemption_mode: str | None = None,
    start_time: float = 0.0,
) -> V0SchedulerAdapter:
    """The v0 scheduler for a node: the shared settings (max_num_seqs,
    max_num_batched_tokens, max_model_len, enable_chunked_prefill, num_gpu_blocks,
    block_size) plus the v0 ones (swap space in blocks, preemption mode). The
    block manager's watermark is vLLM 0.5.3's fixed 1 %, not v1's setting."""
    check_v0_node(name, kv_role, scheduler, pipeline_parallel_size)
    try:
        v0_scheduler = SchedulerConfig(
            max_num_batched_tokens=scheduler.max_num_batched_tokens,
            max_num_seqs=scheduler.max_num_seqs,
            max_model_len=scheduler.max_model_len,
            enable_chunked_prefill=scheduler.enable_chunked_prefill,
            preemption_mode=preemption_mode,
        )
        v0_cache = CacheConfig(
            num_gpu_blocks=cache.num_gpu_blocks, num_cpu_blocks=num_cpu_blocks, block_size=cache.block_size
        )
    except ValueError as exc:
        raise ValueError(f"node {name!r} (engine v0): {exc}") from None
    return V0SchedulerAdapter(v0_scheduler, v0_cache, start_time=start_time)
