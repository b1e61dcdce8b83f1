"""How far a wall-clock run's time is from the model's: pure arithmetic over
the step timings a Ray run's nodes report, and over its requests against an
in-process twin's.

Per step, the distortion is when the step came back minus when the model
says it should have: a step of scaled duration `r` submitted at `s` to a
pipeline of `pp` stages is due at max(s + r, previous completion + r / pp)
(on one stage: it starts when it is submitted or when the step before it
is done, whichever is later). What is left over is control-plane overhead
(frames, event loops, sleeps waking late, CPU contention) — time the model
does not have. A run whose mean distortion exceeds `LIMIT` of the mean
scaled step measures mostly overhead: the report names a `time_scale` that
would keep it under.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import median
from typing import NamedTuple

LIMIT = 0.10  # overhead above 10 % of the scaled step time is reported as distorted
# The suggested time_scale leaves this much headroom below LIMIT: overhead
# grows a little with the run's length and the machine's load.
HEADROOM = 1.5


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


class StepTimingRow(NamedTuple):
    """One step of a node as the wall clock saw it (run seconds): a row of a
    Ray result's `step_timings` (a list in its JSON)."""

    step_index: int
    submitted: float
    completed: float | None  # None: it never came back
    modelled_s: float
    run_s: float


def step_distortion(timings: Sequence[StepTimingRow], pp_size: int) -> dict[str, float] | None:
    """`timings`: one node's steps, in submission order. None when no step
    with work came back."""
    overheads: list[float] = []
    scaled: list[float] = []
    modelled: list[float] = []
    prev_done = -math.inf
    for _, submitted, completed, modelled_s, run_s in timings:
        if completed is None:
            continue
        if run_s > 0:
            due = max(submitted + run_s, prev_done + run_s / pp_size)
            overheads.append(completed - due)
            scaled.append(run_s)
            modelled.append(modelled_s)
        prev_done = completed
    if not scaled:
        return None
    mean_over = sum(overheads) / len(overheads)
    mean_scaled = sum(scaled) / len(scaled)
    return {
        "steps": len(scaled),
        "mean_modelled_ms": round(1000 * sum(modelled) / len(modelled), 4),
        "mean_scaled_ms": round(1000 * mean_scaled, 4),
        "mean_overhead_ms": round(1000 * mean_over, 4),
        "median_overhead_ms": round(1000 * median(overheads), 4),
        "p99_overhead_ms": round(1000 * _pct(overheads, 99), 4),
        "overhead_pct": round(100 * mean_over / mean_scaled, 2),
    }


def suggested_time_scale(mean_overhead_s: float, mean_modelled_s: float) -> float:
    """The smallest "round" time_scale (1, 2, 5 x 10^k) at which the mean
    overhead is under LIMIT / HEADROOM of the scaled step."""
    if mean_overhead_s <= 0 or mean_modelled_s <= 0:
        return 0.0
    need = mean_overhead_s * HEADROOM / (LIMIT * mean_modelled_s)
    k = math.floor(math.log10(need))
    for base in (1, 2, 5, 10):
        if base * 10**k >= need:
            return float(base * 10**k)
    return float(10 ** (k + 1))


def request_distortion(
    wall: dict[str, tuple[float, float]], twin: dict[str, tuple[float, float]], time_scale: float
) -> dict:
    """Per request (TTFT, E2EL) in wall seconds against the in-process twin's
    (model seconds): the error of wall / time_scale, in percent."""
    ttft_err: list[float] = []
    e2el_err: list[float] = []
    for rid, (ttft, e2el) in wall.items():
        if rid not in twin:
            continue
        t_ttft, t_e2el = twin[rid]
        if t_ttft > 0:
            ttft_err.append(100 * (ttft / time_scale - t_ttft) / t_ttft)
        if t_e2el > 0:
            e2el_err.append(100 * (e2el / time_scale - t_e2el) / t_e2el)
    out: dict = {"requests": len(e2el_err)}
    for name, errs in (("ttft", ttft_err), ("e2el", e2el_err)):
        if errs:
            out[f"median_{name}_error_pct"] = round(median(errs), 2)
            out[f"p90_abs_{name}_error_pct"] = round(_pct([abs(e) for e in errs], 90), 2)
    return out


def summarize(per_node: dict[str, dict], time_scale: float) -> dict:
    """The run's distortion: per node, the worst node's share, and a warning
    with a time_scale that would keep it under LIMIT."""
    out: dict = {"time_scale": time_scale, "limit_pct": 100 * LIMIT, "nodes": per_node}
    if not per_node:
        return out
    worst_name, worst = max(per_node.items(), key=lambda kv: kv[1]["overhead_pct"])
    out["overhead_pct"] = worst["overhead_pct"]
    out["worst_node"] = worst_name
    if worst["overhead_pct"] > 100 * LIMIT:
        scale = suggested_time_scale(worst["mean_overhead_ms"], worst["mean_modelled_ms"])
        out["suggested_time_scale"] = scale
        out["warning"] = (
            f"{worst_name}: control-plane overhead is {worst['overhead_pct']:.0f} % of the scaled step time "
            f"({worst['mean_overhead_ms']:.2f} ms per step against {worst['mean_scaled_ms']:.2f} ms at time_scale "
            f"{time_scale:g}); latencies measure overhead more than the model — use time_scale >= {scale:g} "
            f"to keep it under {100 * LIMIT:.0f} %"
        )
    return out
