"""A scenario's in-process runs in worker processes (`disagg-sim run --jobs N`).

Each run of a scenario (a variant and a repeat) is independent and
deterministic: its seed, workload and faults depend only on the scenario,
the variant and the repeat. So a sweep's runs can go to N processes at once
and give the same results as one after another; only the order they finish
in differs, and `runs_in_workers` hands them back in the order they were
asked for, so everything after (the table, thresholds, plots) sees the
sequential order. A worker also builds each run's results JSON and writes
its files (`Sweep.finished_run`), so the parent does not become the
bottleneck of a sweep of large runs.

Workers are started with `spawn`: the parent runs a live progress display
(a thread), and a forked child could inherit one of its locks held. Each
worker imports the simulator once (not the plotting code) and then takes
run after run; a run's `RunResult` comes back pickled (token ids as plain
lists: engine/records.py).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sweep import Sweep


def _finished_run(sweep: Sweep, variant: str, repeat: int):
    return sweep.finished_run(variant, repeat)


def runs_in_workers(sweep: Sweep, keys: list[tuple[str, int]], jobs: int) -> Iterator[tuple[str, int, Future]]:
    """(variant, repeat, future of `Sweep.finished_run`) for each key, in
    the order of `keys`, with up to `jobs` runs going at once. A future's
    `result()` raises what its run raised. Closing the iterator early (a
    crash, Ctrl-C) cancels the runs not started and waits for the ones
    going."""
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(keys)), mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = [(v, r, pool.submit(_finished_run, sweep, v, r)) for v, r in keys]
        yield from futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
