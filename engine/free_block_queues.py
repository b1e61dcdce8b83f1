"""The free block queue's three forms, one order (engine/block_pool.py's
docstring has vLLM's rules): `FreeBlockQueue`, a doubly linked list as vLLM's,
the reference; `FreeBlockStack` (prefix caching off) and `FreeBlockFifo`
(prefix caching on), which the pool uses because they move runs of blocks in C.
tests/unit/test_free_block_stack.py drives each against the reference."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from .kv_cache_block import KVCacheBlock


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
