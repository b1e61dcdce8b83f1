"""A scenario's in-process runs in worker processes (`disagg-sim run --jobs N`).

Each run of a scenario (a variant and a repeat) is independent and
deterministic: its seed, workload and faults depend only on the scenario,
the variant and the repeat. So a sweep's runs can go to N processes at once
and give the same results as one after another; only the order they finish
in differs, and `runs_in_workers` hands them back in the order they were
asked for, so everything after (results files, table, thresholds, plots)
sees the sequential order.

Workers are started with `spawn`: the parent runs a live progress display
(a thread), and a forked child could inherit one of its locks held. Each
worker imports the simulator once and then takes run after run; a run's
`RunResult` comes back pickled (token ids as plain lists: engine/records.py).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor

from cluster.run_result import RunResult

from .scenario import Scenario


def timed_run(scenario: Scenario, variant: str, repeat: int, debug_invariants: bool) -> tuple[RunResult, float]:
    """One in-process run and its wall seconds (in the worker: the pickling
    of the result is not the run's)."""
    from .runner import run_one

    t0 = time.monotonic()
    run = run_one(scenario, variant, repeat, "inproc", None, debug_invariants)
    return run, time.monotonic() - t0


def runs_in_workers(
    scenario: Scenario, keys: list[tuple[str, int]], jobs: int, debug_invariants: bool
) -> Iterator[tuple[str, int, Future]]:
    """(variant, repeat, future of `timed_run`) for each key, in the order
    of `keys`, with up to `jobs` runs going at once. A future's `result()`
    raises what its run raised. Closing the iterator early (a crash, Ctrl-C)
    cancels the runs not started and waits for the ones going."""
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(keys)), mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = [(v, r, pool.submit(timed_run, scenario, v, r, debug_invariants)) for v, r in keys]
        yield from futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
