"""The shadow KV store as it was before its range form (a tag per slot),
kept for tests/e2e_inproc/test_shadow_kv_ranges.py only: the engine's store
(engine/shadow_kv.py) must find exactly what this one finds.

A shadow of a node's KV blocks that records *what* was written where, so
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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from engine import fast_paths


@dataclass
class Violation:
    kind: str  # "stale_write" | "read_foreign" | "read_missing" | "read_hit_mismatch"
    time: float
    block_id: int
    request_id: str
    owner: str | None
    position: int

    def to_dict(self) -> dict:
        return asdict(self)


class ShadowKVStore:
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
        # Slot tags: (request id, position) or None. A block's slot list is
        # allocated lazily to keep big idle pools cheap.
        self.slots: list[list | None] = [None] * num_blocks
        self.owned: list[int] = [0] * num_blocks  # slots holding the owner's content
        self.foreign: list[int] = [0] * num_blocks  # slots holding someone else's
        # Blocks in which a request will find content that is not its own: the
        # block went to someone else, or someone else wrote into it. Kept
        # incrementally so a read costs O(1) for a clean request.
        self._bad: dict[str, set[int]] = {}
        # Per request: (block table object, tokens already verified present).
        self._verified: dict[str, tuple[list[int], int]] = {}
        self.violations: list[Violation] = []
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
        if request_id is not None:
            bad = self._bad.get(request_id)
            if bad is None:
                bad = self._bad[request_id] = set()
            bad.add(block)

    def _clear_bad(self, request_id: str | None, block: int) -> None:
        if request_id is not None:
            bad = self._bad.get(request_id)
            if bad is not None:
                bad.discard(block)
                if not bad:
                    del self._bad[request_id]

    def assign_each(self, pairs) -> None:
        for b, request_id in pairs:
            self.assign((b,), request_id)

    def assign(self, block_ids, request_id: str) -> None:
        owner = self.owner
        for b in block_ids:
            old = owner[b]
            if old != request_id:
                # The previous owner (and readers) may still read it through a stale table.
                self._mark_bad(old, b)
                self._drop_readers(b)
                self._clear_bad(request_id, b)
                owner[b] = request_id
                self.slots[b] = None
                self.owned[b] = 0
                self.foreign[b] = 0
                self.content[b] = None

    def share(self, block_ids, request_id: str, first_index: int = 0) -> None:
        """`request_id` hit these blocks (block indices from `first_index`) in
        the prefix cache: it will read them expecting its own hashes."""
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
        self._verified.pop(request_id, None)
        for block in self._shared_with.pop(request_id, ()):
            readers = self.readers.get(block)
            if readers is not None:
                readers.pop(request_id, None)
                if not readers:
                    del self.readers[block]

    def decode_later(self, *args) -> None:
        """Applied at once: this store defers nothing, so comparing it with
        `engine.shadow_kv` also checks that deferring changes no finding."""
        self.decode(*args)

    def decode_each(self, request_ids: list[str], tables: list[list[int]], starts: list[int], now: float) -> None:
        """A bulk step's calls one by one, as the model runner made them
        before `ShadowKVStore.decode_each` existed."""
        for request_id, table, start in zip(request_ids, tables, starts):
            if start:
                self.decode(request_id, table, start, 1, now, now)
            else:
                self.write(request_id, table, 0, 1, now)

    def retire(self, request_id: str) -> None:
        """Only `forget`: this store keeps every bad-block set, so comparing
        it with `engine.shadow_kv` also checks that retiring changes no finding."""
        self.forget(request_id)

    def snapshot_block(self, block: int) -> list | None:
        slots = self.slots[block]
        return list(slots) if slots is not None else None

    def restore_block(self, block: int, content: list | None) -> None:
        """Copy saved slot tags into `block` (a swap-in): they count as the
        block's owner's content, or as foreign content if they are not."""
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
        bs = self.block_size
        pos = start
        while pos < end:
            idx = pos // bs
            block = block_table[idx]
            stop = min(end, (idx + 1) * bs)
            slots = self.slots[block]
            if slots is None:
                slots = self.slots[block] = [None] * bs
            mine = self.owner[block] == request_id
            if mine and not self.foreign[block] and fast_paths.enabled():
                # The common write, exactly: the owner fills slots nobody has
                # written (a step's new tokens), so every tag is new and its own.
                a, b = pos - idx * bs, stop - idx * bs
                if slots[a:b].count(None) == b - a:
                    slots[a:b] = [(request_id, p) for p in range(pos, stop)]
                    self.owned[block] += b - a
                    if self.expected_hash is not None and self.owned[block] == bs:
                        self.content[block] = self.expected_hash(request_id, idx)
                    pos = stop
                    continue
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
                    if old[0] == self.owner[block]:
                        self.owned[block] -= 1
                        if not mine:
                            self.num_clobbered_slots += 1
                    else:
                        self.foreign[block] -= 1
                slots[s] = new
                if mine:
                    self.owned[block] += 1
                else:
                    self.foreign[block] += 1
            if self.foreign[block] and not had_foreign:
                self._mark_bad(self.owner[block], block)
                self.content[block] = None
                self._drop_readers(block)
            elif had_foreign and not self.foreign[block]:
                self._clear_bad(self.owner[block], block)
            if mine and self.expected_hash is not None and self.owned[block] == bs and not self.foreign[block]:
                # The block holds its writer's full content: remember what it is.
                self.content[block] = self.expected_hash(request_id, idx)
            pos = stop

    def read(self, request_id: str, block_table: list[int], num_tokens: int, now: float) -> bool:
        """Check that positions [0, num_tokens) hold this request's content.

        Foreign content is found through the request's bad-block set; missing
        content only needs checking past what an earlier read of the same
        table verified (content does not disappear without making a block bad)."""
        bs = self.block_size
        ok = True
        full_blocks, tail = divmod(num_tokens, bs)
        nblocks = full_blocks + (1 if tail else 0)
        bad = self._bad.get(request_id)
        if bad:
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

    def summary(self) -> dict:
        return {
            "stale_writes": self.num_stale_writes,
            "clobbered_slots": self.num_clobbered_slots,
            "read_foreign": self.num_read_foreign,
            "read_missing": self.num_read_missing,
            "read_hit_mismatches": self.num_hit_mismatches,
            "corruptions": self.num_corruptions,
        }

    def decode(
        self, request_id: str, block_table: list[int], start: int, n: int, t_read: float, t_write: float
    ) -> None:
        """The calls the model runner and the steady-decode forward made
        before `ShadowKVStore.decode` existed."""
        self.read(request_id, block_table, start, t_read)
        self.write(request_id, block_table, start, start + n, t_write)
        if n > 1:
            self.read(request_id, block_table, start + n - 1, t_write)
