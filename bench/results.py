"""Per-run results: one JSON document per (scenario, variant, repeat), plus a step trace.

The JSON is flat where `vllm bench serve` has a key (`duration`, `completed`,
`mean_ttft_ms`, `p99_e2el_ms`, ...) so existing tooling reads it; the
simulator adds its own keys next to them: the node counters summed over
nodes (`num_preemptions`, `num_zero_progress_preemptions`, ...; `*_peak`
counters take the max instead), step aggregates (`mean_kv_usage`, ...), and
the run's identity (`scenario`, `variant`, `repeat`, `seed`, `clock`).
Per-node detail lives under `nodes` and `steps_per_node`; per-request detail
under `requests` when asked for. The step trace is JSONL, one StepRecord per
line, named next to the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.errors import InputError
from bench.metrics import DEFAULT_PERCENTILES, compute_metrics, request_latencies, step_aggregates
from connector.transport import PullFailure
from engine.records import STEP_FIELDS, RequestRecord, StepRecord

SCHEMA = "disagg-sim.result/1"
CLOCKS = ("virtual", "wall")
# The counters every node reports; others are accepted and aggregated the same way.
NODE_COUNTER_KEYS = (
    "num_preemptions",
    "num_zero_progress_preemptions",
    "num_allocate_slots_calls",
    "deferred_free_blocks_peak",
    "num_blocks_freed_by_drain",
    "kv_corruptions_detected",
)
# Keys a loaded result must have, with their types (bool is not an int here).
REQUIRED_KEYS: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "scenario": (str,),
    "variant": (str,),
    "repeat": (int,),
    "clock": (str,),
    "duration": (int, float),
    "completed": (int,),
    "failed": (int,),
    "total_input_tokens": (int,),
    "total_output_tokens": (int,),
    "request_throughput": (int, float),
    "output_throughput": (int, float),
    "total_token_throughput": (int, float),
    "max_concurrent_requests": (int,),
    **{k: (int,) for k in NODE_COUNTER_KEYS},
}


class ResultsError(InputError):
    pass


def aggregate_counters(counters_by_node: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Sum each counter over nodes, except peaks (`*_peak`), which take the max."""
    out: dict[str, int] = {k: 0 for k in NODE_COUNTER_KEYS}
    for node, counters in counters_by_node.items():
        for key, value in counters.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise ResultsError(f"counter {key!r} of node {node!r} must be an int, got {value!r}")
            out[key] = max(out.get(key, 0), value) if key.endswith("_peak") else out.get(key, 0) + value
    if "prefix_cache_queries" in out:
        # vLLM's hit rate: hits over queries of first admissions (not re-admissions).
        q = out["prefix_cache_queries"]
        out["prefix_cache_hit_rate_pct"] = round(100.0 * out["prefix_cache_hits"] / q, 3) if q else 0  # type: ignore[assignment]
    if "kv_pulls_failed" in out:
        # Per-reason counters appear on a node only once that reason happened;
        # a threshold on one must still find it (as 0) in a run without failures.
        for reason in PullFailure:
            out.setdefault(f"kv_pulls_failed_{reason.value}", 0)
    return out


def build_result(
    *,
    records: Sequence[RequestRecord],
    scenario: str,
    variant: str,
    clock: str,
    repeat: int = 0,
    seed: int | None = None,
    steps: Sequence[StepRecord] = (),
    counters_by_node: Mapping[str, Mapping[str, int]] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    duration: float | None = None,
    include_requests: bool = False,
    include_token_times: bool = False,
    extra: Mapping[str, Any] | None = None,
    slo: Mapping[str, float] | None = None,
    streamed_metrics: Mapping[str, Any] | None = None,
) -> dict:
    """Everything a report needs about one run, as a JSON-ready dict
    (`slo`: latency targets in seconds, for `request_goodput`).
    `streamed_metrics`: the serving metrics already folded from records that
    were streamed and dropped (bench/metrics_stream.py), used instead of
    computing them from `records`."""
    if clock not in CLOCKS:
        raise ResultsError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    counters_by_node = counters_by_node or {}
    if streamed_metrics is not None:
        metric_values = dict(streamed_metrics)
    else:
        metric_values = compute_metrics(records, percentiles=percentiles, duration=duration, slo=slo).to_dict()
    steps_agg = step_aggregates(steps)
    per_node_steps = steps_agg.pop("per_node")
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "scenario": scenario,
        "variant": variant,
        "repeat": repeat,
        "seed": seed,
        "clock": clock,
        "percentiles": list(percentiles),
    }
    result.update(metric_values)
    result.update(aggregate_counters(counters_by_node))
    result.update(steps_agg)
    result["nodes"] = {node: dict(c) for node, c in sorted(counters_by_node.items())}
    result["steps_per_node"] = per_node_steps
    result["step_trace"] = None
    if include_requests:
        result["requests"] = [request_detail(r, include_token_times) for r in records]
    if extra:
        result["extra"] = dict(extra)
    return result


def request_detail(rec: RequestRecord, include_token_times: bool = False) -> dict:
    lat = request_latencies(rec)

    def ms(x: float | None) -> float | None:
        return None if x is None else x * 1000

    d = {
        "request_id": rec.request_id,
        "arrival_time": rec.arrival_time,
        "prompt_len": rec.prompt_len,
        "max_tokens": rec.max_tokens,
        "priority": rec.priority,
        "output_len": len(rec.token_times),
        "finish_reason": rec.finish_reason,
        "success": lat is not None,
        "num_preemptions": rec.num_preemptions,
        "ttft_ms": ms(lat.ttft) if lat else None,
        "tpot_ms": ms(lat.tpot) if lat else None,
        "e2el_ms": ms(lat.e2el) if lat else None,
        "queue_time_ms": ms(rec.queue_time),
        "remote_kv_wait_ms": ms(rec.remote_kv_wait),
        # Where the first token went (proxy/breakdown.py); the parts add up to ttft_ms.
        "ttft_breakdown_ms": (
            None if rec.ttft_breakdown is None else {k: v * 1000 for k, v in rec.ttft_breakdown.items()}
        ),
    }
    if include_token_times:
        d["token_times"] = list(rec.token_times)
    return d


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "_"


def result_stem(scenario: str, variant: str, repeat: int) -> str:
    return f"{_safe(scenario)}__{_safe(variant)}__r{repeat}"


def write_run(out_dir: str | Path, result: dict, steps: Sequence[StepRecord] = ()) -> tuple[Path, Path]:
    """Write `<stem>.json` and `<stem>.steps.jsonl` into out_dir; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(result["scenario"], result["variant"], result["repeat"])
    steps_path = out / f"{stem}.steps.jsonl"
    write_step_trace(steps_path, steps)
    result = dict(result, step_trace=steps_path.name)
    json_path = out / f"{stem}.json"
    json_path.write_text(json.dumps(result, indent=2, allow_nan=True) + "\n")
    return json_path, steps_path


# A step record's JSON line, `json.dumps(step.to_dict())` spelled out: its keys
# never change and its values are numbers (and the node's name), and
# formatting ~60,000 lines through json's encoder took longer than the run.
_STEP_VALUES = operator.attrgetter(*STEP_FIELDS[1:])  # every field but `node`, first
_STEP_LINE = "{" + ", ".join(f'"{k}": %s' for k in (*STEP_FIELDS, "kv_usage")) + "}\n"
_NUMBERS = frozenset((int, float))


def _step_line(s: StepRecord, node_json: dict[str, str]) -> str:
    values = _STEP_VALUES(s)
    kv = s.kv_usage
    node = s.node
    # `%s` writes an int or a finite float exactly as json does; anything else
    # (NaN, infinity, another type) goes through json itself.
    if type(node) is str and _NUMBERS.issuperset(map(type, values)) and all(map(math.isfinite, values)):
        if math.isfinite(kv):
            name = node_json.get(node)
            if name is None:
                name = node_json[node] = json.dumps(node)
            return _STEP_LINE % (name, *values, kv)
    return json.dumps(s.to_dict()) + "\n"


def write_step_trace(path: str | Path, steps: Iterable[StepRecord]) -> None:
    node_json: dict[str, str] = {}
    with Path(path).open("w") as fh:
        fh.writelines(_step_line(s, node_json) for s in steps)


def read_step_trace(path: str | Path) -> list[StepRecord]:
    path = Path(path)
    fields = {f.name: f for f in dataclasses.fields(StepRecord)}
    required = [
        n for n, f in fields.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    steps: list[StepRecord] = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ResultsError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
            missing = [k for k in required if k not in obj]
            if missing:
                raise ResultsError(f"{path}:{lineno}: step record lacks {', '.join(missing)}")
            steps.append(StepRecord(**{k: v for k, v in obj.items() if k in fields}))
    return steps


def validate_result(data: Any, source: str = "<result>") -> dict:
    if not isinstance(data, dict):
        raise ResultsError(f"{source}: a result must be a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise ResultsError(f"{source}: schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    for key, types in REQUIRED_KEYS.items():
        if key not in data:
            raise ResultsError(f"{source}: missing key {key!r}")
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, types):
            names = "/".join(t.__name__ for t in types)
            raise ResultsError(f"{source}: key {key!r} must be {names}, got {v!r}")
    if data["clock"] not in CLOCKS:
        raise ResultsError(f"{source}: clock must be one of {', '.join(CLOCKS)}, got {data['clock']!r}")
    return data


def load_result(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        raise ResultsError(f"{path}: is a directory; allowed: a result file")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: result file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    return validate_result(data, str(path))


def load_results(paths: Iterable[str | Path]) -> list[dict]:
    """Load result files; a directory contributes every `*.json` in it (sorted)."""
    out: list[dict] = []
    seen: dict[tuple[str, str, int], Path] = {}
    for p in paths:
        p = Path(p)
        # In a directory only the per-run files count (`<scenario>__<variant>__r<N>.json`),
        # not other JSON that lives there (v0_report.json, a compare --json summary).
        files = sorted(p.glob("*__r*.json")) if p.is_dir() else [p]
        if p.is_dir() and not files:
            raise ResultsError(f"{p}: directory has no result files (<scenario>__<variant>__r<N>.json)")
        for f in files:
            r = load_result(f)
            key = (r["scenario"], r["variant"], r["repeat"])
            if key in seen:
                raise ResultsError(
                    f"{f}: a second result for variant {r['variant']!r} repeat {r['repeat']} (the first: {seen[key]}); "
                    "allowed: one per variant and repeat - label each result set to compare them: "
                    "compare base=DIR1 cand=DIR2"
                )
            seen[key] = f
            out.append(r)
    return out


def load_steps_for(result: dict, result_path: str | Path) -> list[StepRecord]:
    """The step trace a result JSON points at (empty if it has none)."""
    name = result.get("step_trace")
    if not name:
        return []
    return read_step_trace(Path(result_path).parent / name)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))
