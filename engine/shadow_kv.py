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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Violation:
    kind: str  # "stale_write" | "read_foreign" | "read_missing"
    time: float
    block_id: int
    request_id: str
    owner: str | None
    position: int

    def to_dict(self) -> dict:
        return asdict(self)


class ShadowKVStore:
    def __init__(self, num_blocks: int, block_size: int, max_violations_kept: int = 1000) -> None:
        self.block_size = block_size
        self.owner: list[str | None] = [None] * num_blocks
        # Slot tags: (request id, position) or None. A block's slot list is
        # allocated lazily to keep big idle pools cheap.
        self.slots: list[list | None] = [None] * num_blocks
        self.owned: list[int] = [0] * num_blocks  # slots holding the owner's content
        self.foreign: list[int] = [0] * num_blocks  # slots holding someone else's
        self.violations: list[Violation] = []
        self.max_violations_kept = max_violations_kept
        self.num_stale_writes = 0
        self.num_clobbered_slots = 0
        self.num_read_foreign = 0
        self.num_read_missing = 0

    @property
    def num_corruptions(self) -> int:
        return self.num_stale_writes + self.num_read_foreign + self.num_read_missing

    def _report(self, kind: str, now: float, block: int, req: str, pos: int) -> None:
        if len(self.violations) < self.max_violations_kept:
            self.violations.append(Violation(kind, now, block, req, self.owner[block], pos))

    def assign(self, block_ids, request_id: str) -> None:
        for b in block_ids:
            if self.owner[b] != request_id:
                self.owner[b] = request_id
                self.slots[b] = None
                self.owned[b] = 0
                self.foreign[b] = 0

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
            if not mine:
                self.num_stale_writes += 1
                self._report("stale_write", now, block, request_id, pos)
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
            pos = stop

    def read(self, request_id: str, block_table: list[int], num_tokens: int, now: float) -> bool:
        """Check that positions [0, num_tokens) hold this request's content."""
        bs = self.block_size
        ok = True
        full_blocks, tail = divmod(num_tokens, bs)
        for idx in range(full_blocks + (1 if tail else 0)):
            block = block_table[idx]
            need = bs if idx < full_blocks else tail
            if self.owner[block] != request_id or self.foreign[block]:
                self.num_read_foreign += 1
                self._report("read_foreign", now, block, request_id, idx * bs)
                ok = False
            elif self.owned[block] < need:
                self.num_read_missing += 1
                self._report("read_missing", now, block, request_id, idx * bs)
                ok = False
        return ok

    def summary(self) -> dict:
        return {
            "stale_writes": self.num_stale_writes,
            "clobbered_slots": self.num_clobbered_slots,
            "read_foreign": self.num_read_foreign,
            "read_missing": self.num_read_missing,
            "corruptions": self.num_corruptions,
        }
