"""Paged KV blocks: `KVCacheBlock` and `BlockPool` as in vLLM 0.33.0's
`vllm/v1/core/block_pool.py`, with automatic prefix caching.

The free queue's order decides which block ids are handed out next — so when
a stale in-flight write can land on a reused block, and which cached block is
evicted first. vLLM's rules, kept here:
- allocation takes blocks from the *front* of the free queue; a block that
  still carries a hash is evicted from the cache as it is taken;
- a freed block without a hash (or any block with caching off) goes to the
  front, in the order given (LIFO reuse); a freed block with a hash goes to
  the *tail* (FIFO, so cached blocks are evicted least recently freed first);
- a cache hit on a free block takes it out of the queue (`touch`).

"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .deferred_hashes import PENDING, DeferredHashes
from .free_block_queues import FreeBlockFifo, FreeBlockStack
from .kv_cache_block import BlockHash, KVCacheBlock


class BlockPool:
    """A fixed set of blocks; block 0 is the reserved null block (never handed out)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = False) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks={num_gpu_blocks} is invalid; allowed: an integer >= 2")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        # Blocks held more than once (a cache hit on a block in use): while
        # there are none, a request's blocks all come back when it frees them
        # (engine/steady_decode.py's `block_plan` counts them without a pass).
        self.num_shared = 0
        self.free_block_queue: FreeBlockFifo | FreeBlockStack = (
            FreeBlockFifo(self.blocks[1:]) if enable_caching else FreeBlockStack(self.blocks[1:])
        )
        # The prefix cache: content hash -> the block holding it. vLLM keeps
        # duplicates (two blocks with one hash) and returns the first cached:
        # those hashes map to {block id: block} in caching order. A hash held
        # by one block (nearly all) maps to the block itself: no dict per
        # cached block (every decode block is cached; -1.3 % of W1's
        # instructions with prefix caching on).
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock | dict[int, KVCacheBlock]] = {}
        # Steady-decode blocks cached with their hashes deferred until a
        # lookup could reach them (engine/deferred_hashes.py).
        # (It only hands `cache_block` blocks of this pool.)
        self.deferred = DeferredHashes(self.cache_block)  # type: ignore[arg-type]

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    # -- the prefix cache --------------------------------------------------------
    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        self.deferred.materialize_all()  # (not on a hot path: any hash may be a deferred one's)
        held = self.cached_block_hash_to_block.get(block_hash)
        if isinstance(held, dict):
            return next(iter(held.values()))  # duplicates: the first cached
        return held

    def get_cached_prefix(self, block_hashes: Sequence[BlockHash]) -> list[KVCacheBlock]:
        """`get_cached_block` of each hash in turn, up to the first miss (the
        hashes are chained: every later block misses too). In one loop: a
        preempted request that waits looks its whole prefix up every step."""
        cache = self.cached_block_hash_to_block
        deferred = self.deferred
        parents = deferred.by_parent
        hit: list[KVCacheBlock] = []
        for block_hash in block_hashes:
            held = cache.get(block_hash)
            if held is None:
                break
            hit.append(next(iter(held.values())) if isinstance(held, dict) else held)  # duplicates: the first cached
            if block_hash in parents:
                deferred.reached(block_hash)  # the next hash may be a deferred block's
        return hit

    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[BlockHash],
        num_cached: int,
        num_full: int,
        request_id: str | None = None,
    ) -> None:
        """Enter `blocks[num_cached:num_full]` (of request `request_id`) into
        the cache under their hashes, after any deferred block they could
        duplicate (engine/deferred_hashes.py)."""
        deferred = self.deferred
        parents = deferred.by_parent
        if request_id is not None and request_id in deferred.by_request:
            deferred.materialize(deferred.by_request[request_id])
        cache = self.cached_block_hash_to_block
        for i in range(num_cached, num_full):
            if parents and i > 0 and block_hashes[i - 1] in parents:
                deferred.reached(block_hashes[i - 1])
            block, block_hash = blocks[i], block_hashes[i]
            if block.block_hash is None and not block.is_null and block_hash not in cache:
                block.block_hash = block_hash  # (`cache_block`'s usual case, inline)
                cache[block_hash] = block
            else:
                self.cache_block(block, block_hash)

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Enter one full block into the cache (a block already hashed keeps its entry)."""
        if block.is_null or block.block_hash is not None:
            return
        block.block_hash = block_hash
        cache = self.cached_block_hash_to_block
        same = cache.get(block_hash)
        if same is None:
            cache[block_hash] = block
        elif isinstance(same, dict):
            same[block.block_id] = block
        else:
            cache[block_hash] = {same.block_id: same, block.block_id: block}  # the first cached first

    def _evict(self, block: KVCacheBlock) -> bool:
        """Drop a block's hash from the cache (it is about to be reused)."""
        block_hash = block.block_hash
        if block_hash is None:
            return False
        if block_hash == PENDING:
            self.deferred.drop(block)
            return True
        block.block_hash = None
        cache = self.cached_block_hash_to_block
        same = cache.get(block_hash)
        if same is block:
            del cache[block_hash]
        elif isinstance(same, dict):
            same.pop(block.block_id, None)
            if len(same) == 1:
                cache[block_hash] = next(iter(same.values()))
            elif not same:
                del cache[block_hash]
        return True

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop these blocks' hashes from the cache (their content is not
        valid: a failed KV load); blocks in use stay allocated."""
        for block_id in block_ids:
            self._evict(self.blocks[block_id])

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A cache hit: one more reference; a free block leaves the free queue."""
        blocks = [b for b in blocks if not b.is_null]
        leaving = [b for b in blocks if b.ref_cnt == 0]
        if leaving:
            if len(leaving) > 1:
                leaving = list(dict.fromkeys(leaving))  # (a block named twice leaves once)
            self.free_block_queue.remove_n(leaving)  # (while free: `ref_cnt` 0, as `remove` checks)
        for block in blocks:
            block.ref_cnt += 1
            if block.ref_cnt == 2:
                self.num_shared += 1

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any block is in use, as vLLM does."""
        if self.get_num_free_blocks() != self.num_gpu_blocks - 1:
            return False
        self.cached_block_hash_to_block = {}
        self.deferred.clear()
        for block in self.blocks:
            block.block_hash = None
            block.chain = None
        return True

    # -- allocation and freeing ------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > len(self.free_block_queue):
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool ({len(self.free_block_queue)} free)")
        if num_blocks == 0:
            return []
        out = self.free_block_queue.popleft_n(num_blocks)
        cache = self.cached_block_hash_to_block
        pending = PENDING
        for block in out:
            assert block.ref_cnt == 0, f"block {block.block_id} in the free queue has ref_cnt {block.ref_cnt}"
            block_hash = block.block_hash  # (None whenever caching is off)
            if block_hash is not None:
                if block_hash == pending:  # (`_evict` of a deferred block, inline: most evictions)
                    chain = block.chain
                    block.chain = block.block_hash = None
                    if chain is not None:
                        chain.live -= 1
                        if chain.live == 0:
                            self.deferred.drop_chain(chain)
                elif cache.get(block_hash) is block:  # (`_evict`'s usual case, inline: a hash held once)
                    block.block_hash = None
                    del cache[block_hash]
                else:
                    self._evict(block)
            block.ref_cnt = 1
        return out

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks that reach 0 return to
        the free queue: unhashed ones to the front in the given order (first =
        reused first), hashed ones to the tail (evicted last)."""
        to_front = []
        to_tail = []
        caching = self.enable_caching
        if not caching:
            # Every block that reaches 0 goes to the front: the loop below, without its hash test.
            for block in ordered_blocks:
                if block.is_null:
                    continue
                ref = block.ref_cnt
                if ref <= 0:
                    raise AssertionError(f"double free of block {block.block_id}")
                block.ref_cnt = ref - 1
                if ref == 1:
                    to_front.append(block)
            if to_front:
                self.free_block_queue.prepend_n(to_front)
            return
        for block in ordered_blocks:
            if block.is_null:
                continue
            ref = block.ref_cnt
            if ref <= 0:
                raise AssertionError(f"double free of block {block.block_id}")
            block.ref_cnt = ref - 1
            if ref == 1:
                if block.block_hash is not None:  # (caching is on here)
                    to_tail.append(block)
                else:
                    to_front.append(block)
            elif ref == 2:
                self.num_shared -= 1
        if to_front:
            self.free_block_queue.prepend_n(to_front)
        if to_tail:
            self.free_block_queue.append_n(to_tail)

    def get_usage(self) -> float:
        """Fraction of usable blocks in use (the null block excluded)."""
        usable = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / usable if usable else 0.0
