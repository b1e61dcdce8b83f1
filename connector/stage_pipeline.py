"""When a step leaves a pipeline of `pp_size` stages: stage i is busy for its
share of each step, batches queue per stage in FIFO order, and the stage link
(if any) delays each hand-over between stages. Pure arithmetic on a clock
value, shared by the virtual-clock executor and the wall-clock one."""

from __future__ import annotations

from .link import Link

STAGE_MESSAGE_BYTES = 4096


class StagePipeline:
    def __init__(self, pp_size: int, stage_link: Link | None = None) -> None:
        if pp_size < 1:
            raise ValueError(f"pp_size={pp_size} is invalid; allowed: >= 1")
        self.pp_size = pp_size
        self.stage_link = stage_link
        self.stage_free_at = [0.0] * pp_size

    def finish_time(self, now: float, duration: float) -> float:
        """Submit a step of `duration` at `now`; returns when its last stage ends."""
        share = duration / self.pp_size
        t = now
        for i in range(self.pp_size):
            if i and self.stage_link is not None:
                arrival = self.stage_link.transit(t, STAGE_MESSAGE_BYTES)
                # Stage hops ride a reliable transport: a "lost" message is
                # resent at once, so loss shows up as no extra delay here.
                t = arrival if arrival is not None else t
            start = t if t > self.stage_free_at[i] else self.stage_free_at[i]
            t = start + share
            self.stage_free_at[i] = t
        return t
