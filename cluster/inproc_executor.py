"""The in-process executor: `pp_size` pipeline stages on the virtual clock.

A step occupies each stage for its share of the modelled step time, in
order; a stage works on one batch at a time, so different batches overlap
in different stages. Stage-to-stage hops go through the stage link."""

from __future__ import annotations

from typing import Callable

from connector.link import Link
from engine.model_runner import StepPlan

from .des import EventLoop

STAGE_MESSAGE_BYTES = 4096


class VirtualPipelineExecutor:
    def __init__(self, loop: EventLoop, pp_size: int, stage_link: Link | None = None) -> None:
        if pp_size < 1:
            raise ValueError(f"pp_size={pp_size} is invalid; allowed: >= 1")
        self.loop = loop
        self.pp_size = pp_size
        self.stage_link = stage_link
        self.stage_free_at = [0.0] * pp_size
        self.busy_time = 0.0

    def execute(self, plan: StepPlan, duration: float, on_done: Callable[[StepPlan], None]) -> None:
        share = duration / self.pp_size
        t = self.loop.now
        for i in range(self.pp_size):
            if i and self.stage_link is not None:
                arrival = self.stage_link.transit(t, STAGE_MESSAGE_BYTES)
                # Stage hops ride a reliable transport: a "lost" message is
                # resent at once, so loss shows up as no extra delay here.
                t = arrival if arrival is not None else t
            start = t if t > self.stage_free_at[i] else self.stage_free_at[i]
            t = start + share
            self.stage_free_at[i] = t
        self.busy_time += duration
        self.loop.at(t, on_done, plan)
