"""`KVCacheBlock`, one paged KV block, as vLLM 0.33.0's (vllm/v1/core/kv_cache_utils.py): its own
module so that the pool (engine/block_pool.py) and its free queues (engine/free_block_queues.py) share
it without importing each other."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .deferred_hashes import _Chain


BlockHash = int


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "is_null", "block_hash", "chain", "deferred_at")

    def __init__(self, block_id: int, is_null: bool = False) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.is_null = is_null
        # Set while the block is in the prefix cache (full, hashed content);
        # `PENDING` while its hash is deferred (engine/deferred_hashes.py).
        self.block_hash: BlockHash | None = None
        self.chain: _Chain | None = None  # the deferred chain it is in
        self.deferred_at = 0  # when it was deferred (`DeferredHashes.seq`)

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"
