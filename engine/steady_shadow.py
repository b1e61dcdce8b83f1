"""The shadow-KV decodes a steady-decode cohort owes, issued lazily (issue 15;
docs/fast-paths.md).

In steady decode every member decodes one token a step through its own
blocks, so its shadow-KV reads and writes go cleanly (engine/shadow_kv_decode.py:
it has no bad block, every block of its table is its own). Issuing them at
every event was a pass over the batch per event. Instead each member
remembers the step its decodes were issued up to (`Request.steady_shadow_at`)
and the cohort the end time of every step since, and a member's owed steps go
to the store as one decode when anything else could see its state: when the
cohort settles its members' counters (engine/steady_cohort.py `settle`,
`settle_one`), which is before a plain step, an abort, a member's finish or a
rebuild. One merged decode leaves the store where the steps one by one leave
it, as the store's own merging does.

A steady step's decode happens when it ends (the runner's `finish_step`), not
when it is scheduled: `in_flight` tells the steps scheduled but not yet run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .request import Request
    from .shadow_kv import ShadowKVStore

# Steps' end times kept before the ones no member needs are dropped.
_PRUNE_AT = 4096


class ShadowLag:
    def __init__(self, shadow: ShadowKVStore, tables: Mapping[str, Any]) -> None:
        self.shadow = shadow
        self.tables = tables  # the runner's request states: `tables[id].block_ids`
        self.step_ends: dict[int, float] = {}  # absolute step -> when it ended
        self.in_flight = False  # a steady step scheduled whose decode has not run yet

    def steps_done(self, first: int, ends: list[float]) -> None:
        """Steps `first`, `first + 1`, ... ended at `ends` (their decodes are owed)."""
        self.step_ends.update(zip(range(first, first + len(ends)), ends))

    def catch_up(self, r: Request, upto: int) -> None:
        """Issue member `r`'s decodes of the steps after the last issued, up to `upto`."""
        at = r.steady_shadow_at
        n = upto - at
        if n > 0:
            ends = self.step_ends
            rid = r.request_id
            self.shadow.decode_later(rid, self.tables[rid].block_ids, r.steady_offset + at, n, ends[at + 1], ends[upto])
            r.steady_shadow_at = upto

    def prune(self, members: Any) -> None:
        """Drop the end times of steps every member has been issued."""
        if len(self.step_ends) > _PRUNE_AT:
            oldest = min((r.steady_shadow_at for r in members), default=None)
            if oldest is None:
                self.step_ends = {}
            else:
                self.step_ends = {k: v for k, v in self.step_ends.items() if k > oldest}
