"""The free queues the pool uses (engine/free_block_queues.py: `FreeBlockStack`
without prefix caching, `FreeBlockFifo` with it) hand out and take back
blocks in exactly the order of the linked free queue vLLM's layout uses
(`FreeBlockQueue`), for any mix of the operations the pool makes."""

from __future__ import annotations

import random

import pytest

from engine.block_pool import BlockPool
from engine.free_block_queues import FreeBlockFifo, FreeBlockQueue, FreeBlockStack
from engine.kv_cache_block import KVCacheBlock


@pytest.mark.parametrize("seed", range(20))
def test_the_stack_keeps_the_linked_queue_s_order(seed):
    rng = random.Random(seed)
    blocks = [KVCacheBlock(i) for i in range(64)]
    queue, stack = FreeBlockQueue(blocks, blocks[1:]), FreeBlockStack(blocks[1:])
    taken: list[KVCacheBlock] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.4 and len(queue):
            n = rng.randint(1, min(len(queue), 9))
            got = queue.popleft_n(n)
            assert stack.popleft_n(n) == got
            taken.extend(got)
        elif op < 0.85 and taken:
            # Back to the front (a free without caching) or to the tail (a cached block's free).
            to_front = op < 0.7
            back = rng.sample(taken, rng.randint(1, min(len(taken), 9 if to_front else 5)))
            for b in back:
                taken.remove(b)
            for q in (queue, stack):
                (q.prepend_n if to_front else q.append_n)(back)
        elif len(queue):
            block = rng.choice(list(queue))
            queue.remove(block)
            stack.remove(block)
            taken.append(block)
        assert list(stack) == list(queue) and len(stack) == len(queue)
        probe = rng.choice(blocks[1:])
        assert (probe in stack) == (probe in queue)


@pytest.mark.parametrize("seed", range(12))
def test_the_fifo_keeps_the_linked_queue_s_order(seed):
    """With removals from anywhere (cache hits on free blocks), blocks
    removed and freed again (the dead copies the fifo skips), and long runs
    (its list dropping what was taken). `ref_cnt` as the pool keeps it:
    0 while free."""
    rng = random.Random(seed)
    blocks = [KVCacheBlock(i) for i in range(rng.choice([16, 64, 1500]))]
    queue, fifo = FreeBlockQueue(blocks, blocks[1:]), FreeBlockFifo(blocks[1:])
    taken: list[KVCacheBlock] = []
    for _ in range(1500):
        op = rng.random()
        if op < 0.4 and len(queue):
            n = rng.randint(1, min(len(queue), 40))
            got = queue.popleft_n(n)
            assert fifo.popleft_n(n) == got
            for b in got:
                b.ref_cnt = 1
            taken.extend(got)
        elif op < 0.85 and taken:
            # Back to the front (an unhashed block's free) or to the tail (a hashed block's).
            to_front = op < 0.6
            back = rng.sample(taken, rng.randint(1, min(len(taken), 40)))
            for b in back:
                taken.remove(b)
                b.ref_cnt = 0
            for q in (queue, fifo):
                (q.prepend_n if to_front else q.append_n)(back)
        elif len(queue):
            chosen = rng.sample(list(queue), rng.randint(1, min(len(queue), 4)))
            queue.remove_n(chosen)
            fifo.remove_n(chosen)
            for b in chosen:
                b.ref_cnt = 1
            taken.extend(chosen)
        assert len(fifo) == len(queue)
        if rng.random() < 0.2:
            assert list(fifo) == list(queue)
            probe = rng.choice(blocks[1:])
            assert (probe in fifo) == (probe in queue)
    assert list(fifo) == list(queue)
    assert fifo.popleft_n(len(queue)) == queue.popleft_n(len(queue))


def test_a_pool_without_prefix_caching_uses_the_stack():
    assert type(BlockPool(8, enable_caching=False).free_block_queue) is FreeBlockStack
    assert type(BlockPool(8, enable_caching=True).free_block_queue) is FreeBlockFifo
    with pytest.raises(RuntimeError, match="not free"):
        pool = BlockPool(8, enable_caching=True)
        (block,) = pool.get_new_blocks(1)
        pool.free_block_queue.remove(block)
    with pytest.raises(RuntimeError, match="not free"):
        pool = BlockPool(8)
        (block,) = pool.get_new_blocks(1)
        pool.free_block_queue.remove(block)
