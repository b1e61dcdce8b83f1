"""A scenario's in-process runs in worker processes (`disagg-sim run --jobs N`).

Each run of a scenario (a variant and a repeat) is independent and
deterministic: its seed, workload and faults depend only on the scenario,
the variant and the repeat. So a sweep's runs can go to N processes at once
and give the same results as one after another; only the order they finish
in differs, and `Sweep.runs` hands them back in the order they were
asked for, so everything after (the table, thresholds, plots) sees the
sequential order. A worker also builds each run's results JSON and writes
its files (`Sweep.finished_run`), so the parent does not become the
bottleneck of a sweep of large runs.

Workers are started with `spawn`: the parent runs a live progress display
(a thread), and a forked child could inherit one of its locks held. Each
worker imports the simulator once (not the plotting code) and then takes
run after run; a run's `RunResult` comes back pickled (its token ids as
their runs, not one int each: engine/records.py `TokenIds`).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import NamedTuple


@contextmanager
def worker_pool(jobs: int) -> Iterator[ProcessPoolExecutor | None]:
    """`jobs` worker processes for a sweep's runs (None for 1: the runs go
    in this process). Leaving the block (at the end, or early: a crash,
    Ctrl-C) cancels the runs not started and waits for the ones going."""
    if jobs <= 1:
        yield None
        return
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def runs_in_workers(
    pool: ProcessPoolExecutor, finished_run: Callable[[str, int], object], keys: list[tuple[str, int]]
) -> list[Run]:
    """The runs of `keys`, in that order, handed to the pool's workers, each
    a `Run` whose future is `finished_run(variant, repeat)`'s (its `result()`
    raises what the run raised). `finished_run` goes to the workers pickled:
    a sweep's `Sweep.finished_run`, bound to the sweep it runs."""
    return [Run(v, r, pool.submit(finished_run, v, r)) for v, r in keys]


class Run(NamedTuple):
    variant: str
    repeat: int
    future: Future


class WorkerDied(RuntimeError):
    """A worker process ended without a word (a signal, the kernel's
    out-of-memory killer): the pool is broken, and every run not finished
    is lost (which one the worker was running cannot be told)."""

    def __init__(self, unfinished: list[tuple[str, int]]) -> None:
        named = ", ".join(f"{v} r{r}" for v, r in unfinished[:8]) + (", ..." if len(unfinished) > 8 else "")
        super().__init__(
            f"a worker process died (killed by a signal, or out of memory?) with these runs not finished: {named}"
        )
        self.unfinished = unfinished


def result_of(run: Run, later: list[Run]):
    """`run`'s result; a dead worker as `WorkerDied`, naming the runs (of
    `run` and `later`) that did not finish."""
    try:
        return run.future.result()
    except BrokenProcessPool as err:
        lost = [(r.variant, r.repeat) for r in [run, *later] if _lost(r.future)]
        raise WorkerDied(lost) from err


def _lost(future: Future) -> bool:
    return future.cancelled() or isinstance(future.exception(), BrokenProcessPool)
