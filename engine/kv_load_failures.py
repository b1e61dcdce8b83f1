"""Block-level KV load failures (`KVConnectorOutput.invalid_block_ids`), as
vLLM 0.33.0's `Scheduler._update_requests_with_invalid_blocks`
(`sched.py:3584-3686`): a request whose computed blocks include a block that
did not load is cut back to the longest valid prefix, and the tokens from the
first invalid block on are recomputed (or the request fails, by policy; the
caller decides)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kv_cache_manager import KVCacheManager
    from .request import Request


def update_requests_with_invalid_blocks(
    kvm: KVCacheManager,
    requests: Iterable[Request],
    invalid_block_ids: set[int],
    num_scheduled_tokens: dict[str, int],
    evict_blocks: bool,
) -> tuple[set[str], set[int]]:
    """Cuts each affected request's `num_computed_tokens` back to its first
    invalid block; returns (affected request ids, blocks to evict from the
    prefix cache: each first invalid block and everything after it)."""
    block_size = kvm.block_size
    affected: set[str] = set()
    to_evict: set[int] = set()
    # A block shared by several requests is recomputed by the first one only;
    # the others may keep counting it as computed.
    marked: set[int] = set()
    for request in requests:
        req_id = request.request_id
        block_ids = kvm.get_block_ids(req_id)
        # Only blocks that may hold externally computed tokens: those before
        # this step's scheduled tokens.
        computed = request.num_computed_tokens - num_scheduled_tokens.get(req_id, 0)
        num_computed_blocks = -(-computed // block_size)
        is_affected = False
        truncated = False
        for idx, block_id in zip(range(num_computed_blocks), block_ids):
            if block_id not in invalid_block_ids:
                continue
            is_affected = True
            if block_id in marked:
                continue
            marked.add(block_id)
            if truncated:
                continue
            truncated = True
            request.num_computed_tokens = idx * block_size
            if evict_blocks:
                to_evict.update(block_ids[idx:])
        if is_affected:
            if not truncated:
                # Every invalid block is recomputed by an earlier request.
                request.num_computed_tokens = computed
            affected.add(req_id)
    return affected, to_evict
