"""`KVCacheManager`: per-request block tables over a `BlockPool`, the
`allocate_slots()` admission and growth rule of vLLM 0.33.0
(`vllm/v1/core/kv_cache_manager.py`) for one full-attention group without
prefix caching."""

from __future__ import annotations

from .block_pool import BlockPool, KVCacheBlock
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


# Shared result of an allocation that needed no new block (never mutated).
_NO_NEW_BLOCKS = KVCacheBlocks([])


_WATERMARK_STATUSES = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class KVCacheManager:
    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        max_model_len: int,
        watermark: float = 0.0,
    ) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_gpu_blocks)
        # vLLM counts the null block in the watermark base.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Counter for reports: every allocate_slots() call, successful or not.
        self.num_allocate_slots_calls = 0

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def new_step_starts(self) -> None:
        """Hook kept for vLLM parity (prefix-cache stats reset); nothing to do."""

    def _num_blocks_to_allocate(self, request_id: str, num_tokens: int) -> int:
        have = len(self.req_to_blocks.get(request_id, ()))
        return max(cdiv(num_tokens, self.block_size) - have, 0)

    def get_num_blocks_to_allocate(self, request: Request, num_tokens: int) -> int:
        return self._num_blocks_to_allocate(request.request_id, num_tokens)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Give `request` slots for `num_new_tokens` more tokens (plus lookahead
        and adopted external tokens). Returns the newly allocated blocks, or
        None when they do not fit. `delay_cache_blocks` is accepted for parity;
        without prefix caching there is nothing to cache.

        This runs once per running request per step: it is written for speed
        (locals, no helper calls on the common path)."""
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
            return _NO_NEW_BLOCKS
        if num_new_blocks + watermark > len(free_queue) - reserved_blocks:
            return None
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        if req_blocks is None:
            self.req_to_blocks[request.request_id] = new_blocks[:]
        else:
            req_blocks.extend(new_blocks)
        return KVCacheBlocks(new_blocks)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(list(self.req_to_blocks.get(request_id, ())))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def free(self, request: Request) -> None:
        """Release the request's blocks now, tail first (vLLM's eviction order)."""
        blocks = self.req_to_blocks.pop(request.request_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        """Drop the request's bookkeeping but keep the block references, so
        the caller can return them to the pool later (the deferred free)."""
        return self.req_to_blocks.pop(request.request_id, [])

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0]
