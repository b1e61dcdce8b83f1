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

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from .deferred_hashes import PENDING, DeferredHashes

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


class FreeBlockQueue:
    """The free blocks in eviction order: the front is reused first. A doubly
    linked list over block ids (as vLLM's), so removal from the middle, and
    insertion at either end, cost O(1). The pool uses `FreeBlockStack` or
    `FreeBlockFifo` (cheaper in Python, the same order); this one is their
    reference (tests/unit/test_free_block_stack.py)."""

    __slots__ = ("_blocks", "_next", "_prev", "_len", "_head", "_tail")

    def __init__(self, all_blocks: Sequence[KVCacheBlock], free: Iterable[KVCacheBlock]) -> None:
        n = len(all_blocks)
        self._blocks = all_blocks
        self._head, self._tail = n, n + 1  # sentinels
        self._next = [-1] * (n + 2)
        self._prev = [-1] * (n + 2)
        self._next[self._head] = self._tail
        self._prev[self._tail] = self._head
        self._len = 0
        self.append_n(list(free))

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[KVCacheBlock]:
        nxt, blocks, i = self._next, self._blocks, self._next[self._head]
        while i != self._tail:
            yield blocks[i]
            i = nxt[i]

    def __contains__(self, block: KVCacheBlock) -> bool:
        return self._prev[block.block_id] != -1

    def _unlink(self, i: int) -> None:
        nxt, prev = self._next, self._prev
        p, n = prev[i], nxt[i]
        nxt[p] = n
        prev[n] = p
        nxt[i] = prev[i] = -1
        self._len -= 1

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """The first `n` blocks, unlinked as one run (the hot path of every
        allocation: one walk, no call per block)."""
        nxt, prev, blocks = self._next, self._prev, self._blocks
        out = []
        i = nxt[self._head]
        for _ in range(n):
            out.append(blocks[i])
            j = nxt[i]
            nxt[i] = prev[i] = -1
            i = j
        nxt[self._head] = i
        prev[i] = self._head
        self._len -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        if self._prev[block.block_id] == -1:
            raise RuntimeError(f"remove() of block {block.block_id}, which is not free")
        self._unlink(block.block_id)

    def remove_n(self, blocks: list[KVCacheBlock]) -> None:
        """`remove` of each (a cache hit's free blocks: a resumed request's
        whole prefix), with no call per block."""
        nxt, prev = self._next, self._prev
        for block in blocks:
            i = block.block_id
            p = prev[i]
            if p == -1:
                raise RuntimeError(f"remove() of block {i}, which is not free")
            n = nxt[i]
            nxt[p] = n
            prev[n] = p
            nxt[i] = prev[i] = -1
        self._len -= len(blocks)

    def _link_after(self, anchor: int, blocks: list[KVCacheBlock]) -> None:
        nxt, prev = self._next, self._prev
        after = nxt[anchor]
        p = anchor
        for block in blocks:
            i = block.block_id
            nxt[p] = i
            prev[i] = p
            p = i
        nxt[p] = after
        prev[after] = p
        self._len += len(blocks)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        if blocks:
            self._link_after(self._prev[self._tail], blocks)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """`blocks[0]` ends up first."""
        if blocks:
            self._link_after(self._head, blocks)


class FreeBlockStack:
    """The free queue when prefix caching is off, with `FreeBlockQueue`'s
    interface and order. Then every freed block goes to the front and every
    allocation takes from the front: the queue is a stack, and a Python list
    whose end is the front does both in C, a run of blocks at a time.
    (Nothing is removed from the middle: only a cache hit does that.)"""

    __slots__ = ("_stack",)

    def __init__(self, free: Iterable[KVCacheBlock]) -> None:
        self._stack = list(free)
        self._stack.reverse()  # the first free block at the end: taken first

    def __len__(self) -> int:
        return len(self._stack)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return reversed(self._stack)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return any(b is block for b in self._stack)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        stack = self._stack
        out = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        out.reverse()
        return out

    def remove(self, block: KVCacheBlock) -> None:
        for i, b in enumerate(self._stack):
            if b is block:
                del self._stack[i]
                return
        raise RuntimeError(f"remove() of block {block.block_id}, which is not free")

    def remove_n(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            self.remove(block)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        self._stack[0:0] = blocks[::-1]

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """`blocks[0]` ends up first."""
        self._stack.extend(reversed(blocks))


class FreeBlockFifo:
    """The free queue when prefix caching is on, with `FreeBlockQueue`'s
    interface and order, its common operations done a run of blocks at a
    time in C. Freed blocks without a hash go to the front and hashed ones
    to the tail: a stack of the first (`_front`, its end the front) ahead
    of a list of the rest (`_main[_head:]`, in order). Only a cache hit on
    a free block removes one from the middle: found in the stack (small: an
    allocation empties it first), or else marked in `_dead` (block id ->
    copies of it in `_main` to skip: a removed block freed again is appended
    behind its removed copy, so the first copies met are the dead ones).

    It holds the blocks whose `ref_cnt` is 0 (the pool's invariant; the
    null block aside), which is how `remove` tells a free block."""

    __slots__ = ("_front", "_main", "_head", "_dead", "_len")

    def __init__(self, free: Iterable[KVCacheBlock]) -> None:
        self._front: list[KVCacheBlock] = []
        self._main = list(free)
        self._head = 0
        self._dead: dict[int, int] = {}
        self._len = len(self._main)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[KVCacheBlock]:
        yield from reversed(self._front)
        dead = dict(self._dead)
        main = self._main
        for i in range(self._head, len(main)):
            block = main[i]
            if dead and dead.get(block.block_id):
                dead[block.block_id] -= 1
                continue
            yield block

    def __contains__(self, block: KVCacheBlock) -> bool:
        return any(b is block for b in self)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self._len:
            raise ValueError(f"popleft_n({n}) from a free queue of {self._len} blocks")
        self._len -= n
        front = self._front
        k = len(front)
        if k >= n:
            out = front[k - n :]
            del front[k - n :]
            out.reverse()
            return out
        out = front[::-1]
        front.clear()
        n -= k
        main, head = self._main, self._head
        if not self._dead:
            out += main[head : head + n]
            head += n
        else:
            dead = self._dead
            while n:
                block = main[head]
                head += 1
                left = dead.get(block.block_id)
                if left:
                    if left == 1:
                        del dead[block.block_id]
                    else:
                        dead[block.block_id] = left - 1
                    continue
                out.append(block)
                n -= 1
        if head > 1024 and 2 * head > len(main):
            del main[:head]  # (the list would only grow: drop what was taken)
            head = 0
        self._head = head
        return out

    def remove(self, block: KVCacheBlock) -> None:
        if block.ref_cnt != 0 or block.is_null:
            raise RuntimeError(f"remove() of block {block.block_id}, which is not free")
        front = self._front
        for i in range(len(front) - 1, -1, -1):
            if front[i] is block:
                del front[i]
                self._len -= 1
                return
        self._dead[block.block_id] = self._dead.get(block.block_id, 0) + 1
        self._len -= 1

    def remove_n(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            self.remove(block)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        self._main += blocks
        self._len += len(blocks)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """`blocks[0]` ends up first."""
        self._front.extend(reversed(blocks))
        self._len += len(blocks)


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
