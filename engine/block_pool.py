"""Paged KV blocks: `KVCacheBlock` and `BlockPool` as in vLLM's
`vllm/v1/core/block_pool.py`, without prefix caching (no block hashes).

Free-queue order matters: it decides which block ids are handed out next, and
so when a stale in-flight write can land on a reused block. vLLM puts blocks
without a hash at the *front* of the free queue (reused first), keeping the
order they were freed in; allocation pops from the front.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "is_null")

    def __init__(self, block_id: int, is_null: bool = False) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.is_null = is_null

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt})"


class BlockPool:
    """A fixed set of blocks; block 0 is the reserved null block (never handed out)."""

    def __init__(self, num_gpu_blocks: int) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks={num_gpu_blocks} is invalid; allowed: an integer >= 2")
        self.num_gpu_blocks = num_gpu_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self.free_block_queue: deque[KVCacheBlock] = deque(self.blocks[1:])

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > len(self.free_block_queue):
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool ({len(self.free_block_queue)} free)")
        popleft = self.free_block_queue.popleft
        out = []
        for _ in range(num_blocks):
            block = popleft()
            assert block.ref_cnt == 0, f"block {block.block_id} in the free queue has ref_cnt {block.ref_cnt}"
            block.ref_cnt = 1
            out.append(block)
        return out

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks that reach 0 go to the
        front of the free queue in the given order (first = reused first)."""
        to_front = []
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                raise AssertionError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                to_front.append(block)
        if to_front:
            self.free_block_queue.extendleft(reversed(to_front))

    def get_usage(self) -> float:
        """Fraction of usable blocks in use (the null block excluded)."""
        usable = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / usable if usable else 0.0
