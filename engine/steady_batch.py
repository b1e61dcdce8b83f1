"""The running batch in steady decode (engine/steady_decode.py): its requests
and what every pass over it reads, from the node's cohort. Plain data, below
the steady paths' drivers, so the model runner can read a steady step's
batch without importing them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .cost_model import StepShape
from .request import Request
from .steady_cohort import SteadyCohort


@dataclass
class SteadyBatch:
    """The running batch in steady decode, as `steady_batch` found it: its
    requests in running order and what every pass over it needs, from the
    node's cohort (engine/steady_cohort.py). Step j of the batch is absolute
    step `base + j`."""

    requests: list[Request]  # in running order (a copy)
    ids: list[str]  # their request ids (a copy)
    base: int  # the scheduler's current step when read
    context: int  # the batch's computed tokens before the first step
    cohort: SteadyCohort

    @property
    def first_finish(self) -> int:
        return min(self.cohort.by_finish) - self.base

    @property
    def last_finish(self) -> int:
        return max(self.cohort.by_finish) - self.base

    def finishing(self, j: int) -> list[Request]:
        """The requests step j finishes (by their length cap), in running order."""
        gone = self.cohort.by_finish.get(self.base + j)
        return [] if gone is None else list(gone)

    # What the cohort keeps, per request as relative steps (for tests and tools).
    @property
    def finish_step(self) -> list[int]:
        return [r.steady_finish - self.base for r in self.requests]

    @property
    def block_due(self) -> list[int]:
        return [self.cohort.due_after(r.steady_due, self.base) - self.base for r in self.requests]

    def shapes(self) -> Iterator[StepShape]:
        """The shapes of steps 1, 2, ... (`step_sizes` as `StepShape`s)."""
        for n, ctx in self.step_sizes():
            yield StepShape(0, n, ctx, n, ctx, 0)

    def step_sizes(self) -> Iterator[tuple[int, int]]:
        """(batch size, attended context tokens) of steps 1, 2, ...: one
        decode token per request still running, each attending to its
        computed tokens plus the new one; a request leaves after the step
        that finishes it."""
        by_finish, base = self.cohort.by_finish, self.base
        n, sc, j = len(self.requests), self.context, 0
        while n > 0:
            j += 1
            ctx = sc + n * j
            yield n, ctx
            gone = by_finish.get(base + j)
            if gone is not None:
                n -= len(gone)
                for r in gone:
                    sc -= r.steady_offset + base  # its computed tokens before step 1
