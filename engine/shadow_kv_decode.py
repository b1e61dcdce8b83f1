"""Decode steps in the shadow KV store, and deferring them (issue 15).

A decode step of request r reads its context through its block table, writes
the new positions and (for several steps at once) reads up to the last one
(`decode`). When that went cleanly — r has no bad block, every block it
read is its own and filled far enough, every block it wrote was in range
form (engine/shadow_kv.py) — r is *chained*: the next step, from where this
one ended and through the same table, can only go cleanly too, unless
something else touches r's blocks first. Such steps (`decode_later`) are
not applied one by one but merged into one pending decode per request,
applied when anything else could see r's blocks:

- any operation that may read or write blocks other than the caller's own
  (`share`, a swap's snapshot or restore, a `decode` of an unchained
  request, the summary; a `write` or `read` through a table that reaches a
  block not the caller's, or by a request with a bad block) applies every
  pending decode first; a `write` or `read` applies the caller's own;
- `assign` applies the pending decode of a block's previous owner, `forget`
  and `retire` the one of the request forgotten. (A block assigned to a
  chained request is written by its later steps only.)

A clean decode reports nothing and moves no counter, so merging changes no
finding and no count; the blocks' contents and the read marks end where
the steps one by one leave them (tests/unit/test_shadow_kv.py compares both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any


class DecodeChains:
    """The decode path of `ShadowKVStore` (a base class of it)."""

    # The store's state (engine/shadow_kv.py).
    block_size: int
    owner: list[str | None]
    owned: list[int]
    slots: list[list[Any] | None]
    base: list[int]
    content: list[int | None]
    expected_hash: Callable[[str, int], int | None] | None
    _ranges: bool
    _bad: dict[str, set[int]]
    _verified: dict[str, tuple[list[int], int]]
    _disjoint: dict[str, tuple[list[int], int]]
    if TYPE_CHECKING:

        def read(self, request_id: str, block_table: list[int], num_tokens: int, now: float) -> bool: ...
        def write(self, request_id: str, block_table: list[int], start: int, end: int, now: float) -> None: ...

    # Per chained request: (its block table, where its next decode starts).
    _chain: dict[str, tuple[list[int], int]]
    # Per request: [block table, start, n, t_read, t_write] of its merged pending decode.
    _pending: dict[str, list[Any]]

    def decode(
        self, request_id: str, block_table: list[int], start: int, n: int, t_read: float, t_write: float
    ) -> None:
        """A request's `n` decode steps from position `start`, exactly as
        `read(start)` at `t_read`, `write(start, start + n)` at `t_write` and,
        when n > 1, `read(start + n - 1)` at `t_write`."""
        if self._pending:
            self.settle_all()
        self._decode(request_id, block_table, start, n, t_read, t_write)

    def decode_each(self, request_ids: list[str], tables: list[list[int]], starts: list[int], now: float) -> None:
        """A bulk step's requests, in running order (engine/bulk_step.py):
        `decode(r, table, start, 1, now, now)` each, or for a prompt's last
        token at position 0 `write(r, table, 0, 1, now)`. One call for the
        step: the pending decodes are applied once, first (nothing below
        defers one)."""
        if self._pending:
            self.settle_all()
        decode = self._decode
        for request_id, table, start in zip(request_ids, tables, starts):
            if start:
                decode(request_id, table, start, 1, now, now)
            else:
                self.write(request_id, table, 0, 1, now)

    def decode_later(
        self, request_id: str, block_table: list[int], start: int, n: int, t_read: float, t_write: float
    ) -> None:
        """`decode`, deferred while the request is chained (see the module
        docstring); applied now otherwise."""
        pending = self._pending.get(request_id)
        if pending is not None:
            if pending[0] is block_table and pending[1] + pending[2] == start:
                pending[2] += n
                pending[4] = t_write
                return
            self.settle(request_id)
        chain = self._chain.get(request_id)
        if chain is not None and chain[0] is block_table and chain[1] == start:
            self._pending[request_id] = [block_table, start, n, t_read, t_write]
        elif self._own_table(request_id, block_table, start + n):
            self._decode(request_id, block_table, start, n, t_read, t_write)  # touches only its own blocks
        else:
            self.decode(request_id, block_table, start, n, t_read, t_write)

    def settle(self, request_id: str) -> None:
        """Apply the request's pending decode, if any."""
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            self._apply_pending(request_id, *pending)

    def settle_all(self) -> None:
        """Apply every pending decode. Chained requests write only their own
        blocks, so the order does not matter."""
        pending = self._pending
        while pending:
            request_id, args = pending.popitem()
            self._apply_pending(request_id, *args)

    def _apply_pending(
        self, request_id: str, block_table: list[int], start: int, n: int, t_read: float, t_write: float
    ) -> None:
        """`_decode` of a pending (merged) decode. It goes cleanly by
        construction: the request was chained when it was deferred, and
        anything that could have changed that (another request taking one of
        its blocks, a foreign write, a swap, a cache hit) applied it first. So
        the read finds what `_decode` would check block by block, and the
        write extends each block's filled prefix: only the marks and the
        prefixes move. (With content hashes to keep — prefix caching on —
        `_decode` does it: it records the hash of each block it fills; the
        steady paths cached that block, hash included, when its step was
        scheduled, engine/steady_caching.py.)"""
        if self.expected_hash is not None or n <= 0:
            self._decode(request_id, block_table, start, n, t_read, t_write)
            return
        bs = self.block_size
        owned, base = self.owned, self.base
        end = start + n
        idx = start // bs
        first = idx * bs
        while first < end:
            block = block_table[idx]
            f = owned[block]
            if f == 0:
                base[block] = first
            e = end - first
            if e > bs:
                e = bs
            if e > f:
                owned[block] = e
            idx += 1
            first += bs
        self._verified[request_id] = (block_table, end - 1 if n > 1 else start)
        self._chain[request_id] = (block_table, end)

    def settle_for(self, request_id: str, block_table: list[int], end: int) -> None:
        """Before the request reads or writes positions [0, end) through
        `block_table`: its own pending decode, and everyone's if the table
        reaches a block that is not its own (or it has a bad block)."""
        self.settle(request_id)
        if self._pending and not self._own_table(request_id, block_table, end):
            self.settle_all()

    def _own_table(self, request_id: str, block_table: list[int], end: int) -> bool:
        """No bad block, and every block of positions [0, end) is the request's own.
        Blocks a read through this table verified are still its own: had one
        gone to someone else, the request would have a bad block."""
        if request_id in self._bad:
            return False
        bs = self.block_size
        verified = self._verified.get(request_id)
        first = verified[1] // bs if verified is not None and verified[0] is block_table else 0
        owner = self.owner
        for block in block_table[first : -(-end // bs)]:
            if owner[block] != request_id:
                return False
        return True

    def _decode(
        self, request_id: str, block_table: list[int], start: int, n: int, t_read: float, t_write: float
    ) -> None:
        bs = self.block_size
        owner, owned = self.owner, self.owned
        clean = chainable = request_id not in self._bad
        if not clean:
            # A request with a bad set (a preempted one keeps the blocks it
            # lost) whose table earlier reads found clear of it this far
            # (`ShadowKVStore._disjoint`): `read` would find nothing foreign,
            # so what is left of it is the clean test below.
            disjoint = self._disjoint.get(request_id)
            clean = disjoint is not None and disjoint[0] is block_table and disjoint[1] * bs >= start
        if clean:
            # `_clean`, inlined: this runs once per running request and step.
            verified = self._verified.get(request_id)
            idx = verified[1] // bs if verified is not None and verified[0] is block_table else 0
            full_blocks, tail = divmod(start, bs)
            nblocks = full_blocks + (1 if tail else 0)
            while idx < nblocks:
                block = block_table[idx]
                if owner[block] != request_id or owned[block] < (bs if idx < full_blocks else tail):
                    clean = False
                    break
                idx += 1
        if clean:
            self._verified[request_id] = (block_table, start)
        else:
            self.read(request_id, block_table, start, t_read)
        end = start + n
        if n <= 0:
            self._chain.pop(request_id, None)
            return
        # `write`'s range form, inlined: block by block, the owner's filled prefix grows.
        ranged = self._ranges
        pos = start
        slots, base, expected = self.slots, self.base, self.expected_hash
        while ranged and pos < end:
            idx = pos // bs
            block = block_table[idx]
            a = pos - idx * bs
            e = end - idx * bs
            if e > bs:
                e = bs
            f = owned[block]
            if not (
                owner[block] == request_id
                and slots[block] is None
                and ((f == 0 and a == 0) or (0 < f and a <= f and base[block] == idx * bs))
            ):
                ranged = False
                break
            if f == 0:
                base[block] = idx * bs
            if e > f:
                owned[block] = e
                if e == bs and expected is not None:
                    self.content[block] = expected(request_id, idx)
            elif f == bs and expected is not None:
                self.content[block] = expected(request_id, idx)
            pos = idx * bs + e
        if clean and ranged and chainable:
            # The read of the last position finds what was just written:
            # `read` would only move the mark. (Not for a request with a bad
            # set: a read through its table must test that set.)
            if n > 1:
                self._verified[request_id] = (block_table, end - 1)
            self._chain[request_id] = (block_table, end)
            return
        self._chain.pop(request_id, None)
        if pos < end:
            self.write(request_id, block_table, pos, end, t_write)
        if n > 1:
            self.read(request_id, block_table, end - 1, t_write)
