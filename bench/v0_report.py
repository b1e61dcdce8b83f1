"""The v0 starvation report: the run record of each variant (the fields of
docs/reference.md, "v0: A record of one run"), whether its waiting
queue drains, and which starvation path dominates -- computed from the v0
scheduler's path counters (`engine.v0.starvation`), never guessed.

    renderable, data = v0_report(outcome.results, outcome.runs, scenario)

`data` is JSON-ready: {"variants": {name: {"run_record": ..., "diagnosis": ...,
"runs": [per-repeat run records]}}}. `v0_run_record(result, spec, run)` gives
one run's record, e.g. to store next to its results JSON. Variants on the v1
engine (a control) get the same record with the v0-only fields empty.

The queue verdict: "never drains" when the waiting queue stayed non-empty
without a break for at least half of the run, "drains" when its longest such
stretch is under a quarter of the run, "backlogged" in between.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from cluster.spec import ClusterSpec
from engine.records import StepRecord
from engine.v0.starvation import StarvationCounters, diagnose

_CONFIG_KEYS = {
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "block_size",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "num_prompts",
}

NEVER_DRAINS_SHARE = 0.5
DRAINS_SHARE = 0.25

# Rows of the table: (label, key in the run record, format).
_ROWS: list[tuple[str, str, str]] = [
    ("engine / policy", "engine_policy", "s"),
    ("max_num_seqs", "max_num_seqs", "d"),
    ("max_num_batched_tokens", "max_num_batched_tokens", "d"),
    ("enable_chunked_prefill", "enable_chunked_prefill", "s"),
    ("preemption_mode", "preemption_mode", "s"),
    ("block_size", "block_size", "d"),
    ("GPU / CPU (swap) blocks", "blocks", "s"),
    ("prompts, rate (req/s)", "load", "s"),
    ("prompt len mean / max", "prompt_len", "s"),
    ("waiting (Pending) mean / max", "waiting", "s"),
    ("running mean / max", "running", "s"),
    ("swapped mean / max", "swapped", "s"),
    ("GPU KV usage mean / max", "gpu_usage", "s"),
    ("CPU KV usage mean / max", "cpu_usage", "s"),
    ("waiting non-empty, longest", "waiting_nonempty", "s"),
    ("preemptions (recompute / swap)", "preemptions", "s"),
    ("ignored prompts", "num_ignored_prompts", "d"),
    ("TTFT P99 / mean (s)", "ttft", "s"),
    ("TPOT P99 / mean (ms)", "tpot", "s"),
    ("queue", "queue_verdict", "s"),
    ("dominant starvation path", "dominant_path", "s"),
]


# ---- one run ---------------------------------------------------------------------------------


def longest_nonempty_waiting(steps: Sequence[StepRecord]) -> float:
    """Longest stretch (s) over which every recorded step saw a non-empty
    waiting queue (summed over nodes per step time)."""
    longest = 0.0
    since: float | None = None
    for s in sorted(steps, key=lambda s: s.time):
        if s.num_waiting > 0:
            since = s.time if since is None else since
            longest = max(longest, s.time - since)
        else:
            since = None
    return longest


def queue_verdict(longest_s: float, duration_s: float) -> str:
    share = longest_s / duration_s if duration_s > 0 else 0.0
    if share >= NEVER_DRAINS_SHARE:
        return "never drains"
    if share < DRAINS_SHARE:
        return "drains"
    return "backlogged"


def starvation_counters(result: Mapping[str, Any]) -> StarvationCounters | None:
    """The path counters a result carries (summed over nodes), or None for a v1 run."""
    fields = [f for f in StarvationCounters.__dataclass_fields__ if f != "head_of_line_blockers"]
    if not all(f"starvation_{f}" in result for f in fields):
        return None
    counts: dict[str, Any] = {f: int(result[f"starvation_{f}"]) for f in fields}
    return StarvationCounters(**counts)


def _engine_settings(spec: ClusterSpec):
    group = spec.decode if not spec.disaggregated else spec.prefill
    return group.engine


def _mean(num: float, den: float) -> float | None:
    return num / den if den else None


def v0_run_record(result: Mapping[str, Any], spec: ClusterSpec, run=None) -> dict:
    """One run's record: configuration, load, observed queues and KV usage,
    preemptions, ignored prompts, latencies, queue verdict and dominant path.
    `run` (a RunResult) adds what only its request and step records hold: the
    observed prompt lengths and arrival rate, and the queue stretch of a v1 run."""
    e = _engine_settings(spec)
    v0 = e.engine == "v0"
    rec: dict[str, Any] = {
        "engine": e.engine,
        "scheduling_policy": "fcfs" if v0 else e.policy,
        "max_num_seqs": e.max_num_seqs,
        "max_num_batched_tokens": e.max_num_batched_tokens,
        "max_model_len": e.max_model_len,
        "enable_chunked_prefill": e.enable_chunked_prefill,
        "preemption_mode": (e.preemption_mode if v0 else None),
        "block_size": e.block_size,
        "num_gpu_blocks": e.num_gpu_blocks,
        "num_cpu_blocks": e.num_cpu_blocks if v0 else None,
        "num_prompts": result.get("num_requests"),
    }
    if run is not None and run.requests:
        arrivals = sorted(r.arrival_time for r in run.requests)
        span = arrivals[-1] - arrivals[0]
        rec["request_rate"] = (len(arrivals) - 1) / span if span > 0 else None
        prompts = [r.prompt_len for r in run.requests]
        rec["prompt_len_mean"] = statistics.fmean(prompts)
        rec["prompt_len_max"] = max(prompts)
    duration = float(result.get("duration") or 0.0)
    steps_n = result.get("v0_num_steps", 0)
    rec.update(
        {
            "duration_s": duration,
            "num_waiting_mean": result.get("mean_num_waiting"),
            "num_waiting_max": result.get("max_num_waiting"),
            "num_waiting_final": result.get("v0_num_waiting_final"),
            "num_running_mean": result.get("mean_num_running"),
            "num_running_max": result.get("max_num_running"),
            "num_swapped_mean": _mean(result.get("v0_swapped_request_steps", 0), steps_n) if v0 else None,
            "num_swapped_max": result.get("v0_num_swapped_peak") if v0 else None,
            "gpu_cache_usage_mean": result.get("mean_kv_usage"),
            "gpu_cache_usage_max": result.get("max_kv_usage"),
            "cpu_cache_usage_mean": (
                _mean(result.get("v0_cpu_blocks_used_steps", 0), steps_n * e.num_cpu_blocks)
                if v0 and e.num_cpu_blocks
                else None
            ),
            "cpu_cache_usage_max": (
                _mean(result.get("v0_cpu_blocks_used_peak", 0), e.num_cpu_blocks) if v0 and e.num_cpu_blocks else None
            ),
            "num_preemptions": result.get("num_preemptions"),
            "num_preemptions_recompute": result.get("num_preemptions_recompute"),
            "num_preemptions_swap": result.get("num_preemptions_swap"),
            "num_ignored_prompts": result.get("num_ignored_prompts"),
            "ttft_p99_ms": result.get("p99_ttft_ms"),
            "ttft_mean_ms": result.get("mean_ttft_ms"),
            "tpot_p99_ms": result.get("p99_tpot_ms"),
            "tpot_mean_ms": result.get("mean_tpot_ms"),
            "completed": result.get("completed"),
            "failed": result.get("failed"),
        }
    )
    if run is not None:
        longest = longest_nonempty_waiting(run.steps)
    elif "v0_waiting_nonempty_ms_peak" in result:
        longest = result["v0_waiting_nonempty_ms_peak"] / 1000.0
    else:
        longest = None
    rec["waiting_nonempty_longest_s"] = longest
    rec["waiting_nonempty_share"] = longest / duration if longest is not None and duration > 0 else None
    rec["queue_verdict"] = queue_verdict(longest, duration) if longest is not None else None
    counters = starvation_counters(result)
    rec["status"] = diagnose(counters)[0] if counters is not None else None
    return rec


def diagnosis(result: Mapping[str, Any]) -> dict | None:
    """The dominant path with the scores it was chosen on, or None for a v1 run."""
    c = starvation_counters(result)
    if c is None:
        return None
    path, explanation = diagnose(c)
    return {
        "dominant_path": path,
        "explanation": explanation,
        "scores": {
            "head-of-line": c.head_of_line_bypassable,
            "preempt-reinsert": c.recompute_overtaken,
            "swap-priority": c.swap_priority_bypassable,
        },
        "head_of_line_by_kv_allocation": c.head_of_line_alloc_later,
        "head_of_line_by_budget": c.head_of_line_budget,
    }


# ---- the scenario --------------------------------------------------------------------------


def _merged_counters(results: Sequence[Mapping[str, Any]]) -> dict:
    """Starvation counters summed over repeats, for one diagnosis per variant."""
    out: dict[str, int] = {}
    for r in results:
        for k, v in r.items():
            if k.startswith("starvation_") and isinstance(v, int):
                out[k] = out.get(k, 0) + v
    return out


def _avg(records: Sequence[dict], key: str) -> float | None:
    xs = [r[key] for r in records if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return statistics.fmean(xs) if xs else None


def _f(x: float | None, fmt: str = ".1f", scale: float = 1.0, unit: str = "") -> str:
    return "–" if x is None else format(x * scale, fmt) + unit


def _cells(recs: list[dict], diag: dict | None) -> dict[str, str]:
    r0 = recs[0]
    a = lambda k: _avg(recs, k)  # noqa: E731 - mean over repeats
    verdicts = sorted({r["queue_verdict"] for r in recs if r.get("queue_verdict")})
    return {
        "engine_policy": f"{r0['engine']} / {r0['scheduling_policy']}",
        "max_num_seqs": str(r0["max_num_seqs"]),
        "max_num_batched_tokens": str(r0["max_num_batched_tokens"]),
        "enable_chunked_prefill": str(r0["enable_chunked_prefill"]).lower(),
        "preemption_mode": str(r0["preemption_mode"] or "–"),
        "block_size": str(r0["block_size"]),
        "blocks": f"{r0['num_gpu_blocks']} / {r0['num_cpu_blocks'] if r0['num_cpu_blocks'] is not None else '–'}",
        "load": f"{_f(a('num_prompts'), '.0f')}, {_f(a('request_rate'), '.2f')}",
        "prompt_len": f"{_f(a('prompt_len_mean'), '.0f')} / {_f(a('prompt_len_max'), '.0f')}",
        "waiting": f"{_f(a('num_waiting_mean'))} / {_f(a('num_waiting_max'), '.0f')}",
        "running": f"{_f(a('num_running_mean'))} / {_f(a('num_running_max'), '.0f')}",
        "swapped": f"{_f(a('num_swapped_mean'), '.2f')} / {_f(a('num_swapped_max'), '.0f')}",
        "gpu_usage": f"{_f(a('gpu_cache_usage_mean'), '.0f', 100, '%')} / "
        f"{_f(a('gpu_cache_usage_max'), '.0f', 100, '%')}",
        "cpu_usage": f"{_f(a('cpu_cache_usage_mean'), '.1f', 100, '%')} / "
        f"{_f(a('cpu_cache_usage_max'), '.1f', 100, '%')}",
        "waiting_nonempty": (
            f"{_f(a('waiting_nonempty_longest_s'), unit=' s')} "
            f"({_f(a('waiting_nonempty_share'), '.0f', 100, '%')} of the run)"
        ),
        "preemptions": (
            f"{_f(a('num_preemptions'), '.0f')} ({_f(a('num_preemptions_recompute'), '.0f')} / "
            f"{_f(a('num_preemptions_swap'), '.0f')})"
        ),
        "num_ignored_prompts": _f(a("num_ignored_prompts"), ".0f"),
        "ttft": f"{_f(a('ttft_p99_ms'), '.2f', 1e-3)} / {_f(a('ttft_mean_ms'), '.2f', 1e-3)}",
        "tpot": f"{_f(a('tpot_p99_ms'))} / {_f(a('tpot_mean_ms'))}",
        "queue_verdict": ", ".join(verdicts) or "–",
        "dominant_path": diag["dominant_path"] if diag else "– (v1: no path counters)",
    }


def v0_report(results: Sequence[dict], runs: Mapping[tuple[str, int], Any], scenario) -> tuple[Group | None, dict]:
    """(renderable, data) for a scenario's results; (None, {}) when no variant runs engine v0.
    `runs` maps (variant, repeat) to its RunResult (may be empty); `scenario` gives each
    variant's cluster (`scenario.cluster(variant)`)."""
    by_variant: dict[str, list[dict]] = {}
    for r in results:
        by_variant.setdefault(r["variant"], []).append(r)
    if not any(_engine_settings(scenario.cluster(v)).engine == "v0" for v in by_variant):
        return None, {}
    data: dict[str, Any] = {"variants": {}}
    table = Table(title="v0 run records (mean over repeats)")
    table.add_column("", style="bold")
    columns: list[dict[str, str]] = []
    for variant, rs in by_variant.items():
        rs = sorted(rs, key=lambda r: r["repeat"])
        spec = scenario.cluster(variant)
        recs = [v0_run_record(r, spec, runs.get((variant, r["repeat"]))) for r in rs]
        diag = diagnosis(_merged_counters(rs)) if recs[0]["engine"] == "v0" else None
        data["variants"][variant] = {
            "run_record": recs[0] if len(recs) == 1 else _mean_record(recs),
            "diagnosis": diag,
            "runs": recs,
        }
        table.add_column(escape(variant), justify="right")
        columns.append(_cells(recs, diag))
    for label, key, _ in _ROWS:
        table.add_row(label, *(escape(c[key]) for c in columns))
    lines: list[Table | str] = [table]
    for variant, entry in data["variants"].items():
        d = entry["diagnosis"]
        if d is not None:
            lines.append(f"[bold]{escape(variant)}[/]: {escape(d['explanation'])}")
    drained = [v for v, e in data["variants"].items() if e["run_record"].get("queue_verdict") == "drains"]
    starved = [v for v, e in data["variants"].items() if e["run_record"].get("queue_verdict") == "never drains"]
    lines.append(
        f"waiting queue drains in: {escape(', '.join(drained) or 'none')}; "
        f"never drains in: {escape(', '.join(starved) or 'none')}"
    )
    return Group(*lines), data


def _mean_record(recs: list[dict]) -> dict:
    """Numbers averaged over repeats; everything else from the first repeat."""
    out = dict(recs[0])
    for k, v in out.items():
        if k not in _CONFIG_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = _avg(recs, k)
    verdicts = {r.get("queue_verdict") for r in recs}
    out["queue_verdict"] = verdicts.pop() if len(verdicts) == 1 else "mixed: " + ", ".join(sorted(map(str, verdicts)))
    return out
