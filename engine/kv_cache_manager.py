"""`KVCacheManager`: per-request block tables over a `BlockPool`, the
`allocate_slots()` admission and growth rule of vLLM 0.33.0
(`vllm/v1/core/kv_cache_manager.py`) for one full-attention group, with
automatic prefix caching (`get_computed_blocks`, `cache_blocks`, the
prefix-cache stats)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .block_hash import extend_block_hashes, first_block_hash, update_block_hashes
from .block_pool import BlockPool
from .kv_cache_block import KVCacheBlock
from .request import Request, RequestStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheBlocks:
    """The blocks an allocation produced (vLLM returns one tuple per group)."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.blocks = blocks

    def get_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]

    def get_unhashed_block_ids(self) -> list[int]:
        """The blocks not in the prefix cache (what a KV load must fill)."""
        return [b.block_id for b in self.blocks if b.block_hash is None]


# Shared result of an allocation that needed no new block, and of a lookup
# that found nothing (never mutated).
_NO_NEW_BLOCKS = KVCacheBlocks([])
EMPTY_BLOCKS = NO_NEW_BLOCKS = _NO_NEW_BLOCKS


@dataclass
class PrefixCacheStats:
    """vLLM's `PrefixCacheStats`: tokens looked up and found, counted when a
    request is admitted; a re-admitted (preempted) request counts apart."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


_WATERMARK_STATUSES = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class KVCacheManager:
    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        max_model_len: int,
        watermark: float = 0.0,
        enable_caching: bool = False,
    ) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        # Per request: how many of its leading blocks are in the cache already.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        # vLLM counts the null block in the watermark base.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Counter for reports: every allocate_slots() call, successful or not.
        self.num_allocate_slots_calls = 0
        # Deferred prompt hashes (engine/deferred_hashes.py, "Prompt blocks"):
        # the sampler's `tokens_at` while an in-process batch run takes the
        # fast paths (cluster/inproc/cluster.py sets it), else None. Its
        # chains may go on with the request's steady decode blocks, whose
        # ids are the sampler's.
        self.defer_prompt_hashes: Callable[[str, int, int], list[int]] | None = None

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def new_step_starts(self) -> None:
        """Hook kept for vLLM parity; the stats here are cumulative."""

    def _num_blocks_to_allocate(self, request_id: str, num_tokens: int) -> int:
        have = len(self.req_to_blocks.get(request_id, ()))
        return max(cdiv(num_tokens, self.block_size) - have, 0)

    def get_num_blocks_to_allocate(self, request: Request, num_tokens: int) -> int:
        return self._num_blocks_to_allocate(request.request_id, num_tokens)

    # -- prefix caching ----------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest run of cached full blocks from the start of the request
        (capped so the last token is always recomputed, to sample from it),
        and the number of tokens they hold."""
        if not self.enable_caching:
            return EMPTY_BLOCKS, 0
        bs = self.block_size
        max_blocks = (request.num_tokens - 1) // bs
        if self.defer_prompt_hashes is not None and max_blocks > 0:
            # Hashes are chained and a lookup stops at its first miss: when
            # the first block misses, no other hash is needed (nor worked
            # out: a prompt's other blocks are cached deferred, below).
            hashes = first_block_hash(request, bs)
            if hashes[0] not in self.block_pool.cached_block_hash_to_block:
                return EMPTY_BLOCKS, 0
        hashes = update_block_hashes(request, bs)
        hit = self.block_pool.get_cached_prefix(hashes[:max_blocks])
        if not hit:
            return EMPTY_BLOCKS, 0
        return KVCacheBlocks(hit), len(hit) * bs

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        if self.enable_caching:
            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Enter the request's full blocks up to `num_tokens` into the cache."""
        if not self.enable_caching:
            return
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        if min(num_tokens, request.num_tokens) // self.block_size <= num_cached:
            return  # no block completed since the last call (most calls)
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        tokens_at = self.defer_prompt_hashes
        if tokens_at is not None:
            bs = self.block_size
            num_full = min(num_tokens, request.num_tokens) // bs
            if num_full * bs <= request.num_prompt_tokens and self._cache_prompt_blocks(
                request, blocks, num_cached, num_full, tokens_at
            ):
                return
        hashes = update_block_hashes(request, self.block_size)
        num_full = min(num_tokens, len(hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(blocks, hashes, num_cached, num_full, request_id)
        self.num_cached_block[request_id] = num_full

    def _cache_prompt_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached: int,
        num_full: int,
        tokens_at: Callable[[str, int, int], list[int]],
    ) -> bool:
        """`cache_blocks` of prompt blocks `num_cached..num_full` (their
        content never changes): the first block hashed, those past the
        request's known hashes cached with their hashes deferred until a
        lookup could reach them (engine/deferred_hashes.py). False (nothing
        done) when they would neither start at its known hashes nor
        continue its chain."""
        bs = self.block_size
        pool = self.block_pool
        request_id = request.request_id
        hashes = first_block_hash(request, bs)
        have = len(hashes)
        start = num_cached if num_cached > have else have
        if start > have and num_full > start:
            chain = pool.deferred.by_request.get(request_id)
            if chain is None or chain.request is not request or chain.table is not blocks or chain.next != start:
                return False
        if num_cached < have:
            pool.cache_full_blocks(blocks, hashes, num_cached, min(have, num_full), request_id)
        if num_full > start:
            pool.deferred.defer(request, blocks, start, num_full, bs, tokens_at)
        self.num_cached_block[request_id] = num_full
        return True

    def cache_steady_blocks(
        self,
        request: Request,
        num_tokens: int,
        tokens_at: Callable[[str, int, int], list[int]],
        sampler_tokens_at: Callable[[str, int, int], list[int]] | None = None,
    ) -> None:
        """`cache_blocks(request, num_tokens)` for a steady-decode member,
        whose counters are written lazily (engine/steady_cohort.py): the
        steady paths call it at the step that completes a block, as
        `allocate_slots` would. The tokens are `num_tokens` by then; those
        not written yet are the sampler's.

        Past the request's first hashed block, the blocks are cached with
        their hashes deferred (engine/deferred_hashes.py: worked out only
        when a lookup could reach them); `sampler_tokens_at` is what draws
        their ids then (`tokens_at` may be one forward's)."""
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = num_tokens // self.block_size
        if num_full <= num_cached:
            return
        blocks = self.req_to_blocks[request_id]
        pool = self.block_pool
        have = len(request.block_hashes)
        if have == 0 or sampler_tokens_at is None:
            hashes = extend_block_hashes(request, num_full, self.block_size, tokens_at)
            pool.cache_full_blocks(blocks, hashes, num_cached, num_full, request_id)
        else:
            if num_cached < have:  # (blocks whose hashes are known: cached as usual)
                pool.cache_full_blocks(blocks, request.block_hashes, num_cached, min(have, num_full), request_id)
            if num_full > have:
                start = max(num_cached, have)
                pool.deferred.defer(request, blocks, start, num_full, self.block_size, sampler_tokens_at)
        self.num_cached_block[request_id] = num_full

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Give `request` slots for `num_new_tokens` more tokens (plus lookahead,
        the prefix-cache hit `new_computed_blocks` and adopted external
        tokens). Returns the newly allocated blocks, or None when they do not
        fit. Then caches the full blocks of what is computed by the end of the
        step, unless `delay_cache_blocks` (a KV load lands later).

        This runs once per running request per step: the common path (a
        running request, no hit) is written for speed."""
        if new_computed_blocks is not None and new_computed_blocks.blocks:
            return self._allocate_with_hit(
                request,
                num_new_tokens,
                num_new_computed_tokens,
                new_computed_blocks.blocks,
                num_lookahead_tokens,
                num_external_computed_tokens,
                delay_cache_blocks,
                full_sequence_must_fit,
                reserved_blocks,
                has_scheduled_reqs,
            )
        self.num_allocate_slots_calls += 1
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")
        bs = self.block_size
        max_len = self.max_model_len
        req_blocks = self.req_to_blocks.get(request.request_id)
        have = len(req_blocks) if req_blocks is not None else 0
        total_computed = request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        if total_computed > max_len:
            total_computed = max_len
        watermark = 0
        if has_scheduled_reqs and self.watermark_blocks and request.status in _WATERMARK_STATUSES:
            watermark = self.watermark_blocks
        free_queue = self.block_pool.free_block_queue
        if full_sequence_must_fit:
            full = request.num_tokens if request.num_tokens < max_len else max_len
            if -(-full // bs) - have + watermark > len(free_queue):
                return None
        need_slot = total_computed + num_new_tokens + num_lookahead_tokens
        if need_slot > max_len:
            need_slot = max_len
        num_new_blocks = -(-need_slot // bs) - have
        if num_new_blocks <= 0:
            if watermark > len(free_queue) - reserved_blocks:
                return None
            if self.enable_caching and not delay_cache_blocks:
                # Most steps complete no block: check that before the call.
                to_cache = min(total_computed + num_new_tokens, request.num_tokens)
                if to_cache // bs > self.num_cached_block.get(request.request_id, 0):
                    self.cache_blocks(request, to_cache)
            return _NO_NEW_BLOCKS
        if num_new_blocks + watermark > len(free_queue) - reserved_blocks:
            return None
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        if req_blocks is None:
            self.req_to_blocks[request.request_id] = new_blocks[:]
        else:
            req_blocks.extend(new_blocks)
        if self.enable_caching and not delay_cache_blocks:
            to_cache = min(total_computed + num_new_tokens, request.num_tokens)
            if to_cache // bs > self.num_cached_block.get(request.request_id, 0):
                self.cache_blocks(request, to_cache)
        return KVCacheBlocks(new_blocks)

    def _allocate_with_hit(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        hit: list[KVCacheBlock],
        num_lookahead_tokens: int,
        num_external_computed_tokens: int,
        delay_cache_blocks: bool,
        full_sequence_must_fit: bool,
        reserved_blocks: int,
        has_scheduled_reqs: bool,
    ) -> KVCacheBlocks | None:
        """`allocate_slots` for a first admission with a prefix-cache hit:
        the hit blocks count against the free blocks when they are free
        (taking them out of the queue), then they are touched and the request
        starts its table with them."""
        bs = self.block_size
        max_len = self.max_model_len
        request_id = request.request_id
        total_computed = min(
            request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens, max_len
        )
        watermark = 0
        if has_scheduled_reqs and self.watermark_blocks and request.status in _WATERMARK_STATUSES:
            watermark = self.watermark_blocks
        free = self.block_pool.get_num_free_blocks()
        # The blocks to allocate: those the hits do not cover, and each hit on
        # a free block, which leaves the free queue and so costs a free block
        # like a new one (vLLM's "evictable" hits); counted once for both tests.
        have = len(self.req_to_blocks.get(request_id, ())) + len(hit)
        evictable = sum(1 for b in hit if b.ref_cnt == 0 and not b.is_null)
        if full_sequence_must_fit:
            full = min(request.num_tokens, max_len)
            if max(cdiv(full, bs) - have, 0) + evictable + watermark > free:
                return None
        need_slot = min(total_computed + num_new_tokens + num_lookahead_tokens, max_len)
        if max(cdiv(need_slot, bs) - have, 0) + evictable + watermark > free - reserved_blocks:
            return None
        assert not self.req_to_blocks.get(request_id), "a request with blocks has no new prefix-cache hits"
        pool = self.block_pool
        pool.touch(hit)
        req_blocks = self.req_to_blocks[request_id] = list(hit)
        self.num_cached_block[request_id] = len(hit)
        if num_external_computed_tokens > 0:
            n_ext = max(0, cdiv(total_computed, bs) - len(req_blocks))
            req_blocks.extend(pool.get_new_blocks(n_ext))
        n_new = cdiv(need_slot, bs) - len(req_blocks)
        new_blocks = pool.get_new_blocks(n_new) if n_new > 0 else []
        req_blocks.extend(new_blocks)
        if not delay_cache_blocks:
            self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks(new_blocks)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(list(self.req_to_blocks.get(request_id, ())))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def free(self, request: Request) -> None:
        """Release the request's blocks now, tail first (vLLM's eviction order)."""
        blocks = self.pop_blocks_for_free(request)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        """Drop the request's bookkeeping but keep the block references, so
        the caller can return them to the pool later (the deferred free)."""
        self.num_cached_block.pop(request.request_id, None)
        return self.req_to_blocks.pop(request.request_id, [])

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0]
