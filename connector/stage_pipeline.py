"""When a step leaves a pipeline of `pp_size` stages: stage i is busy for its
share of each step, batches queue per stage in FIFO order, and the stage link
(if any) delays each hand-over between stages. Pure arithmetic on a clock
value, shared by the virtual-clock executor and the wall-clock one."""

from __future__ import annotations

import math

from .link import Link, ReliableLine

STAGE_MESSAGE_BYTES = 4096


class StagePipeline:
    def __init__(self, pp_size: int, stage_link: Link | None = None) -> None:
        if pp_size < 1:
            raise ValueError(f"pp_size={pp_size} is invalid; allowed: >= 1")
        self.pp_size = pp_size
        self.stage_link = stage_link
        # Stage hops ride TCP: loss costs retransmissions, never order.
        self._hop = None if stage_link is None else ReliableLine(stage_link.forward)
        self.stage_free_at = [0.0] * pp_size

    def finish_time(self, now: float, duration: float) -> float:
        """Submit a step of `duration` at `now`; returns when its last stage ends
        (inf: a stage link broke — an outage outlasted the retransmissions)."""
        share = duration / self.pp_size
        t = now
        for i in range(self.pp_size):
            if i and self._hop is not None:
                arrival = self._hop.transit(t, STAGE_MESSAGE_BYTES)
                if arrival is None:
                    return math.inf
                t = arrival
            start = t if t > self.stage_free_at[i] else self.stage_free_at[i]
            t = start + share
            self.stage_free_at[i] = t
        return t
