"""Helpers for tests that drive `disagg-sim` as a user does: a subprocess,
and a small results directory written without running anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.results import build_result, write_run
from engine.records import RequestRecord

ROOT = Path(__file__).resolve().parents[2]

# variant -> per repeat: (num_preemptions, num_zero_progress_preemptions, ttft seconds), on two decode nodes
RUNS = {
    "fixed": [(2, 0, 0.5), (4, 0, 1.5)],
    "prefix": [(40, 10, 1.0), (60, 30, 3.0)],
}


def cli(*args: str, columns: int | None = None, env: dict | None = None, timeout: float = 300):
    """`disagg-sim ARGS` in a subprocess from the repository root (stdout not a terminal)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("COLUMNS", None)
    if columns is not None:
        full_env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "bench.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=full_env,
        timeout=timeout,
    )


def tiny_results(dir: Path, runs: dict = RUNS, name: str = "res") -> Path:
    """A results directory: each variant's repeats, counters split over decode-0 and decode-1
    (decode-1 carries a third of the preemptions)."""
    out = dir / name
    out.mkdir(parents=True, exist_ok=True)
    for variant, reps in runs.items():
        for rep, (pre, zp, ttft) in enumerate(reps):
            rec = RequestRecord(
                "a", 0.0, 10, 2, token_times=[ttft, ttft + 0.1], finish_time=ttft + 0.1, finish_reason="length"
            )
            counters = {
                "decode-0": {"num_preemptions": pre - pre // 3, "num_zero_progress_preemptions": zp - zp // 3},
                "decode-1": {"num_preemptions": pre // 3, "num_zero_progress_preemptions": zp // 3},
            }
            result = build_result(
                records=[rec], scenario="s", variant=variant, clock="virtual", repeat=rep, counters_by_node=counters
            )
            write_run(out, result)
    return out
