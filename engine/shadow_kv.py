"""A shadow of a node's KV blocks that records *what* was written where, so
the safety property the fence protects can be checked.

Each slot holds a tag (request id, token position). The worker tells the
store who owns a block when it learns of it (from a `SchedulerOutput`, or a
KV load's target blocks). Then:
- a step writes its tokens' KV when it completes (the in-flight write); a
  write onto a block that now belongs to another request is a *stale write*,
  the corruption the deferred-free fence exists to prevent;
- a KV pull writes the pulled blocks when it lands;
- a step reads the context it attends to; a read that finds another
  request's content, or nothing, is reported.

With prefix caching a block is shared: its writer owns it, and a request
that hit it in the cache is a *reader* that expects the content its hash
names. A full block records the hash of what its writer wrote (asked of
`expected_hash(request_id, block_index)`); a reader's read checks it — a hit
on a block whose content is not what its hash says is a corruption
("read_hit_mismatch") — and a block handed to a new owner, or written by
someone else, turns bad for every reader too.

Slot tags are kept per block as a range while they can be (fast paths on): a
block its owner filled from slot 0 in order holds tags (owner, base + s) for
s < owned, so it needs no slot list — just `base`, the position of its slot 0.
A block gets an explicit tag list (`slots`) only when something leaves that
shape: a write past a gap or through another table index, a foreign write, a
swap-in. Both forms give the same findings; the range form makes a decode
step's write a few integer updates instead of a tag per token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from itertools import islice, repeat
from typing import Any

from . import fast_paths
from .shadow_kv_decode import DecodeChains


@dataclass
class Violation:
    kind: str  # "stale_write" | "read_foreign" | "read_missing" | "read_hit_mismatch"
    time: float
    block_id: int
    request_id: str
    owner: str | None
    position: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class ShadowKVStore(DecodeChains):
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_violations_kept: int = 1000,
        expected_hash: Callable[[str, int], int | None] | None = None,
    ) -> None:
        self.block_size = block_size
        # Prefix caching: the hash of a block's complete content, and who reads
        # it through a cache hit expecting which hash.
        self.expected_hash = expected_hash
        self.content: list[int | None] = [None] * num_blocks
        self.readers: dict[int, dict[str, int | None]] = {}
        self._shared_with: dict[str, list[int]] = {}
        self.owner: list[str | None] = [None] * num_blocks
        # Slot tags: (request id, position) or None. `slots[b] is None` is the
        # range form: slots [0, owned[b]) hold (owner[b], base[b] + s) and no
        # slot holds foreign content; otherwise `slots[b]` lists every tag.
        self.slots: list[list[Any] | None] = [None] * num_blocks
        self.base: list[int] = [0] * num_blocks
        # With the fast paths off every written block gets its tag list (the
        # plain form), so tests can compare both forms run against run.
        self._ranges = fast_paths.enabled()
        self.owned: list[int] = [0] * num_blocks  # slots holding the owner's content
        self.foreign: list[int] = [0] * num_blocks  # slots holding someone else's
        # Blocks in which a request will find content that is not its own: the
        # block went to someone else, or someone else wrote into it. Kept
        # incrementally so a read costs O(1) for a clean request.
        self._bad: dict[str, set[int]] = {}
        # Requests no step can read for any more (`retire`): their blocks'
        # later fates are not tracked for them.
        self._retired: set[str] = set()
        # Per request: (block table object, tokens already verified present).
        self._verified: dict[str, tuple[list[int], int]] = {}
        # Per request with a bad set: (block table object, how many of its
        # first blocks hold none of that set). A table only grows (a new one
        # is a new list) and the set only grows through `_mark_bad`, which
        # drops the entry, so a read tests only the blocks past those.
        self._disjoint: dict[str, tuple[list[int], int]] = {}
        self.violations: list[Violation] = []
        self._chain = {}
        self._pending = {}
        self.max_violations_kept = max_violations_kept
        self.num_stale_writes = 0
        self.num_clobbered_slots = 0
        self.num_read_foreign = 0
        self.num_read_missing = 0
        self.num_hit_mismatches = 0

    @property
    def num_corruptions(self) -> int:
        return self.num_stale_writes + self.num_read_foreign + self.num_read_missing + self.num_hit_mismatches

    def _report(self, kind: str, now: float, block: int, req: str, pos: int) -> None:
        if len(self.violations) < self.max_violations_kept:
            self.violations.append(Violation(kind, now, block, req, self.owner[block], pos))

    def _mark_bad(self, request_id: str | None, block: int) -> None:
        if request_id is not None and request_id not in self._retired:
            self._chain.pop(request_id, None)
            bad = self._bad.get(request_id)
            if bad is None:
                bad = self._bad[request_id] = set()
            bad.add(block)
            self._disjoint.pop(request_id, None)

    def _clear_bad(self, request_id: str | None, block: int) -> None:
        if request_id is not None:
            bad = self._bad.get(request_id)
            if bad is not None:
                bad.discard(block)
                if not bad:
                    del self._bad[request_id]

    def assign(self, block_ids: Iterable[int], request_id: str) -> None:
        self.assign_each(zip(block_ids, repeat(request_id)))

    def assign_each(self, pairs: Iterable[tuple[int, str]]) -> None:
        """Each (block, request) pair in order: the block now belongs to the
        request (a step's new blocks, one per request that took one, in one
        call)."""
        owner = self.owner
        bad_of = self._bad
        readers = self.readers
        retired = self._retired
        # A request's own pending decode stays: it wrote only blocks it
        # already had, and its later writes into these come after this.
        pending, chain = self._pending, self._chain
        slots, owned, foreign, content = self.slots, self.owned, self.foreign, self.content
        disjoint = self._disjoint
        # Hoisted per call (this runs once per block a request takes): nothing
        # below adds a reader, and a block's content hash is only ever set with
        # hashes to check (prefix caching), so without them it stays None.
        has_readers = bool(readers)
        hashes = self.expected_hash is not None
        for b, request_id in pairs:
            old = owner[b]
            if old == request_id:
                continue
            if old is not None:
                if old in chain:
                    # The block leaves a chained request: apply what it wrote first
                    # (that cannot mark anyone: a chained request's writes go cleanly).
                    if pending:
                        self.settle(old)
                    chain.pop(old, None)
                # The previous owner (and readers) may still read it through a stale table.
                if old not in retired:
                    bad = bad_of.get(old)
                    if bad is None:
                        bad = bad_of[old] = set()
                    bad.add(b)
                    disjoint.pop(old, None)  # (`_mark_bad`, inlined)
            if has_readers and b in readers:
                self._drop_readers(b)  # a reader taking the block over is marked too
            if bad_of:
                mine = bad_of.get(request_id)
                if mine is not None:
                    mine.discard(b)
                    if not mine:
                        del bad_of[request_id]
            owner[b] = request_id
            slots[b] = None
            owned[b] = 0
            foreign[b] = 0
            if hashes:
                content[b] = None

    def share(self, block_ids: Iterable[int], request_id: str, first_index: int = 0) -> None:
        """`request_id` hit these blocks (block indices from `first_index`) in
        the prefix cache: it will read them expecting its own hashes."""
        if not block_ids:
            return
        if self._pending:
            self.settle_all()
        owner = self.owner
        expected = self.expected_hash
        for i, b in enumerate(block_ids):
            if owner[b] == request_id:
                continue
            self._clear_bad(request_id, b)
            readers = self.readers.get(b)
            if readers is None:
                readers = self.readers[b] = {}
            readers[request_id] = expected(request_id, first_index + i) if expected is not None else None
            self._shared_with.setdefault(request_id, []).append(b)

    def _drop_readers(self, block: int) -> None:
        readers = self.readers.pop(block, None)
        if readers:
            for reader in readers:
                self._mark_bad(reader, block)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's read cache. Its bad-block set stays: a
        step still in flight may read through its old table and must be
        caught."""
        self.settle(request_id)
        self._chain.pop(request_id, None)
        self._verified.pop(request_id, None)
        self._disjoint.pop(request_id, None)
        for block in self._shared_with.pop(request_id, ()):
            readers = self.readers.get(block)
            if readers is not None:
                readers.pop(request_id, None)
                if not readers:
                    del self.readers[block]

    def prune(self, keep: set[str]) -> int:
        """Forget finished requests for good (a long-running server): every
        request outside `keep` (the ones a step or a pull may still touch)
        that no block names as its owner or reader can never be looked up
        again, so its bad-block set, read cache and retirement go. Returns
        how many requests were forgotten."""
        named = {o for o in self.owner if o is not None}
        for readers in self.readers.values():
            named.update(readers)
        named.update(self._pending)
        known = set(self._retired) | self._bad.keys() | self._verified.keys() | self._disjoint.keys()
        known |= self._chain.keys() | self._shared_with.keys()
        gone = known - keep - named
        for request_id in gone:
            self._retired.discard(request_id)
            self._bad.pop(request_id, None)
            self._verified.pop(request_id, None)
            self._disjoint.pop(request_id, None)
            self._chain.pop(request_id, None)
            self._shared_with.pop(request_id, None)
        return len(gone)

    def retire(self, request_id: str) -> None:
        """A finished request that no step can read for any more (none in
        flight includes it, and no KV pull will read its blocks): its
        bad-block set goes, and none is kept for it from now on. Without
        this a long run keeps one entry per block ever reused from a
        finished request. What any read finds is unchanged: it has no reads left."""
        self.forget(request_id)
        self._bad.pop(request_id, None)
        self._retired.add(request_id)

    def _materialize(self, block: int) -> list[Any]:
        """The block's tag list, made from its range form if it has none."""
        slots = self.slots[block]
        if slots is None:
            bs = self.block_size
            slots = self.slots[block] = [None] * bs
            owner, base = self.owner[block], self.base[block]
            for s in range(self.owned[block]):
                slots[s] = (owner, base + s)
        return slots

    def snapshot_block(self, block: int) -> list[Any] | None:
        if self._pending:
            self.settle_all()
        slots = self.slots[block]
        if slots is None:
            # Range form: nothing written since the block was assigned is None.
            return self._materialize(block).copy() if self.owned[block] else None
        return list(slots)

    def restore_block(self, block: int, content: list[Any] | None) -> None:
        """Copy saved slot tags into `block` (a swap-in): they count as the
        block's owner's content, or as foreign content if they are not."""
        if self._pending:
            self.settle_all()
        owner = self.owner[block]
        self.slots[block] = content
        tags = [t for t in content or () if t is not None]
        self.owned[block] = sum(1 for t in tags if t[0] == owner)
        self.foreign[block] = len(tags) - self.owned[block]
        if self.foreign[block]:
            self._mark_bad(owner, block)
        else:
            self._clear_bad(owner, block)

    def write(self, request_id: str, block_table: list[int], start: int, end: int, now: float) -> None:
        """Write KV for positions [start, end) through `block_table`."""
        if self._pending:
            self.settle(request_id)  # its own pending decode first; everyone's below if needed
        self._chain.pop(request_id, None)
        bs = self.block_size
        pos = start
        owner, owned, slots_of, base = self.owner, self.owned, self.slots, self.base
        ranged = ranges = self._ranges
        expected = self.expected_hash
        if ranges and pos % bs == 0:
            # The usual prefill: the owner fills its fresh blocks from slot 0,
            # whole blocks in order. Each is what the range form below makes of
            # an empty block it owns (base = its first position, owned = what
            # was written), without the general case's tests.
            idx = pos // bs
            while pos < end:
                block = block_table[idx]
                if owned[block] or owner[block] != request_id or slots_of[block] is not None:
                    break  # not fresh (or not the owner's): the general case
                stop = pos + bs
                if stop > end:
                    stop = end
                base[block] = pos
                owned[block] = stop - pos
                if expected is not None and stop - pos == bs:
                    self.content[block] = expected(request_id, idx)
                pos = stop
                idx += 1
        if pos < end and self._pending and not self._own_table(request_id, block_table, end):
            # The rest may write into someone else's block: every pending
            # decode lands first (`settle_for`). The fresh blocks above were
            # the writer's own, which no one else's pending decode touches.
            self.settle_all()
        while pos < end:
            idx = pos // bs
            block = block_table[idx]
            first = idx * bs
            stop = end if end < first + bs else first + bs
            mine = owner[block] == request_id
            if mine and ranges and slots_of[block] is None:
                # Range form: the owner extends (or rewrites) its filled prefix.
                a, e, f = pos - first, stop - first, owned[block]
                if f == 0 and a == 0:
                    base[block] = first
                    f = -1  # so that the write below counts all of [0, e)
                if f < 0 or (base[block] == first and a <= f):
                    if e > f:
                        owned[block] = e
                    if expected is not None and owned[block] == bs:
                        # The block holds its writer's full content: remember what it is.
                        self.content[block] = expected(request_id, idx)
                    pos = stop
                    continue
            ranged = False
            slots = self._materialize(block) if self._ranges else slots_of[block]
            if slots is None:
                slots = slots_of[block] = [None] * bs
            if not mine:
                self.num_stale_writes += 1
                self._report("stale_write", now, block, request_id, pos)
            had_foreign = self.foreign[block]
            for p in range(pos, stop):
                s = p - idx * bs
                old = slots[s]
                new = (request_id, p)
                if old == new:
                    continue
                if old is not None:
                    if old[0] == owner[block]:
                        owned[block] -= 1
                        if not mine:
                            self.num_clobbered_slots += 1
                    else:
                        self.foreign[block] -= 1
                slots[s] = new
                if mine:
                    owned[block] += 1
                else:
                    self.foreign[block] += 1
            if self.foreign[block] and not had_foreign:
                self._mark_bad(owner[block], block)
                self.content[block] = None
                self._drop_readers(block)
            elif had_foreign and not self.foreign[block]:
                self._clear_bad(owner[block], block)
            if mine and self.expected_hash is not None and owned[block] == bs and not self.foreign[block]:
                # The block holds its writer's full content: remember what it is.
                self.content[block] = self.expected_hash(request_id, idx)
            pos = stop
        if ranged and request_id not in self._bad:
            # The owner's own write in range form after a clean read up to
            # `start` (or from 0): a decode from `end` can only go cleanly.
            verified = self._verified.get(request_id)
            if start == 0 or (verified is not None and verified[0] is block_table and verified[1] >= start):
                self._chain[request_id] = (block_table, end)

    def read(self, request_id: str, block_table: list[int], num_tokens: int, now: float) -> bool:
        """Check that positions [0, num_tokens) hold this request's content.

        Foreign content is found through the request's bad-block set; missing
        content only needs checking past what an earlier read of the same
        table verified (content does not disappear without making a block bad)."""
        if self._pending:
            self.settle_for(request_id, block_table, num_tokens)
        bs = self.block_size
        if request_id not in self._bad and self._clean(request_id, block_table, num_tokens):
            return True
        ok = True
        full_blocks, tail = divmod(num_tokens, bs)
        nblocks = full_blocks + (1 if tail else 0)
        bad = self._bad.get(request_id)
        # A preempted request keeps the blocks it lost in its bad set for the
        # rest of its life; most of them are not in its new table: that test
        # runs in C, and only on the blocks no earlier read found clear.
        if bad:
            clear = self._disjoint.get(request_id)
            checked = clear[1] if clear is not None and clear[0] is block_table else 0
            if checked < nblocks:
                if bad.isdisjoint(islice(block_table, checked, nblocks)):
                    if self._ranges:  # (a fast path: off, every read tests the whole table)
                        self._disjoint[request_id] = (block_table, nblocks)
                else:
                    for idx in range(nblocks):
                        block = block_table[idx]
                        if block in bad:
                            self.num_read_foreign += 1
                            self._report("read_foreign", now, block, request_id, idx * bs)
                            ok = False
        verified = self._verified.get(request_id)
        start_idx = verified[1] // bs if verified is not None and verified[0] is block_table else 0
        owner, owned = self.owner, self.owned
        good_upto = num_tokens
        readers = self.readers
        for idx in range(start_idx, nblocks):
            block = block_table[idx]
            need = bs if idx < full_blocks else tail
            if owner[block] == request_id:
                if owned[block] < need:
                    self.num_read_missing += 1
                    self._report("read_missing", now, block, request_id, idx * bs)
                    ok = False
                    good_upto = min(good_upto, idx * bs)
                continue
            expected = readers.get(block, {}).get(request_id, 0)
            if expected != 0 and (expected is None or self.content[block] != expected):
                # A cache hit on a block whose content is not what its hash says.
                self.num_hit_mismatches += 1
                self._report("read_hit_mismatch", now, block, request_id, idx * bs)
                ok = False
                good_upto = min(good_upto, idx * bs)
        self._verified[request_id] = (block_table, good_upto)
        return ok

    def _clean(self, request_id: str, block_table: list[int], num_tokens: int) -> bool:
        """`read` for a request with no bad block whose unverified blocks are
        all its own and filled far enough: nothing to report, so only the
        verified mark moves. False (and nothing changed) otherwise."""
        bs = self.block_size
        verified = self._verified.get(request_id)
        idx = verified[1] // bs if verified is not None and verified[0] is block_table else 0
        full_blocks, tail = divmod(num_tokens, bs)
        nblocks = full_blocks + (1 if tail else 0)
        owner, owned = self.owner, self.owned
        while idx < nblocks:
            block = block_table[idx]
            if owner[block] != request_id or owned[block] < (bs if idx < full_blocks else tail):
                return False
            idx += 1
        self._verified[request_id] = (block_table, num_tokens)
        return True

    def summary(self) -> dict[str, int]:
        if self._pending:
            self.settle_all()
        return {
            "stale_writes": self.num_stale_writes,
            "clobbered_slots": self.num_clobbered_slots,
            "read_foreign": self.num_read_foreign,
            "read_missing": self.num_read_missing,
            "read_hit_mismatches": self.num_hit_mismatches,
            "corruptions": self.num_corruptions,
        }
