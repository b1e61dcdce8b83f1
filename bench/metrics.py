"""Serving metrics from request and step records, defined as `vllm bench serve` defines them.

Per successful request (finish_reason "stop"/"length" with at least one token):
  TTFT  = first token time - arrival time
  E2EL  = finish time - arrival time (vLLM's `latency`: send to end of stream)
  ITL   = every gap between consecutive token times
  TPOT  = (E2EL - TTFT) / (output tokens - 1), only for requests with > 1 token
Output tokens of a request = number of token times recorded. Failed requests
(anything else, including requests still unfinished when the run ended) add
nothing to the token totals, as in vLLM.

Statistics follow vLLM's `calculate_metrics`: numpy mean/median/std
(population std) and `np.percentile` (linear interpolation), reported in ms;
an empty list counts as [0] (`np.mean(xs or 0)`). Throughputs divide by the
run duration. `max_concurrent_requests` is the exact maximum number of
successful requests whose [arrival, finish) intervals overlap — vLLM buckets
this by whole seconds, which overcounts; we sweep the intervals instead.
`max_output_tokens_per_s` keeps vLLM's per-second bucketing.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.records import RequestRecord, StepRecord
from proxy.breakdown import PARTS as TTFT_PARTS

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
EXTRA_LATENCY_METRICS = ("queue_time", "remote_kv_wait")
# The TTFT breakdown's statistics, always (`mean_/median_/p99_ttft_<part>_ms`).
BREAKDOWN_PERCENTILES: tuple[float, ...] = (99,)


def breakdown_keys() -> list[str]:
    """The result keys of the TTFT breakdown, in part order."""
    return [f"{stat}_ttft_{part}_ms" for part in TTFT_PARTS for stat in ("mean", "median", "p99")]


def percentile_word(p: float) -> str:
    """vLLM's spelling of a percentile in result keys: 99 -> '99', 99.9 -> '99.9'."""
    return str(int(p)) if int(p) == p else str(p)


@dataclass
class LatencyStats:
    count: int
    mean_ms: float
    median_ms: float
    std_ms: float
    percentiles_ms: dict[float, float]

    def to_keys(self, name: str) -> dict[str, float]:
        out = {f"mean_{name}_ms": self.mean_ms, f"median_{name}_ms": self.median_ms, f"std_{name}_ms": self.std_ms}
        for p, v in self.percentiles_ms.items():
            out[f"p{percentile_word(p)}_{name}_ms"] = v
        return out


def latency_stats(values_s: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> LatencyStats:
    """Seconds in, milliseconds out; an empty list behaves like [0] (vLLM's `xs or 0`)."""
    xs = list(values_s) or [0.0]
    arr = np.asarray(xs, dtype=float)
    return LatencyStats(
        count=len(values_s),
        mean_ms=float(np.mean(arr) * 1000),
        median_ms=float(np.median(arr) * 1000),
        std_ms=float(np.std(arr) * 1000),
        percentiles_ms={p: float(np.percentile(arr, p) * 1000) for p in percentiles},
    )


@dataclass
class RequestLatencies:
    """What one successful request contributes to the latency lists."""

    ttft: float
    e2el: float
    token_times: Sequence[float]
    tpot: float | None
    output_len: int

    @property
    def itls(self) -> list[float]:
        """The gaps between consecutive tokens (worked out when asked: only
        the ITL statistics read them, and a run has millions)."""
        times = self.token_times
        return list(map(operator.sub, times[1:], times))


def request_latencies(record: RequestRecord) -> RequestLatencies | None:
    """None for a failed or unfinished request."""
    if not record.succeeded:
        return None
    times = record.token_times
    ttft = times[0] - record.arrival_time
    end = record.finish_time if record.finish_time is not None else times[-1]
    e2el = end - record.arrival_time
    n = len(times)
    return RequestLatencies(
        ttft=ttft,
        e2el=e2el,
        token_times=times,
        tpot=(e2el - ttft) / (n - 1) if n > 1 else None,
        output_len=n,
    )


@dataclass
class ServeMetrics:
    num_requests: int
    completed: int
    failed: int
    num_unfinished: int
    total_input_tokens: int
    total_output_tokens: int
    duration: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    max_concurrent_requests: int
    max_output_tokens_per_s: float
    percentiles: tuple[float, ...]
    latencies: dict[str, LatencyStats] = field(default_factory=dict)
    # Per part of the TTFT (proxy/breakdown.py), over the successful requests that have one.
    ttft_breakdown: dict[str, LatencyStats] = field(default_factory=dict)
    # With latency targets (`slo`): the completed requests that met them all.
    good: int | None = None

    def to_dict(self) -> dict[str, float | int]:
        """Flat dict with `vllm bench serve`'s result keys (plus our queue/remote-KV ones)."""
        out: dict[str, float | int] = {
            "duration": self.duration,
            "num_requests": self.num_requests,
            "completed": self.completed,
            "failed": self.failed,
            "num_unfinished": self.num_unfinished,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_concurrent_requests": self.max_concurrent_requests,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
        }
        for name, stats in self.latencies.items():
            out.update(stats.to_keys(name))
        for part, stats in self.ttft_breakdown.items():
            name = f"ttft_{part}"
            out[f"mean_{name}_ms"] = stats.mean_ms
            out[f"median_{name}_ms"] = stats.median_ms
            out[f"p99_{name}_ms"] = stats.percentiles_ms[99]
        if self.good is not None:
            out["request_goodput"] = self.good / self.duration if self.duration > 0 else 0.0
            out["slo_attainment_pct"] = 100.0 * self.good / self.num_requests if self.num_requests else 0.0
        return out


def run_window(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """Default run window: first arrival to the last finish (or last token)."""
    if not records:
        return 0.0, 0.0
    start = min(r.arrival_time for r in records)
    ends = [
        r.finish_time if r.finish_time is not None else r.token_times[-1]
        for r in records
        if r.finish_time is not None or r.token_times
    ]
    return start, max(ends, default=start)


def compute_metrics(
    records: Sequence[RequestRecord],
    *,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    duration: float | None = None,
    slo: Mapping[str, float] | None = None,
) -> ServeMetrics:
    """Aggregate a run's request records. `duration` defaults to `run_window`'s span.
    `slo`: latency targets in seconds by metric ("ttft", "tpot", "e2el"): the
    completed requests meeting every one are counted (goodput, as vLLM's
    `--goodput` and DistServe count it; a one-token request's TPOT is 0)."""
    for p in percentiles:
        if not 0 <= p <= 100:
            raise ValueError(f"percentile {p} is outside [0, 100]")
    if duration is None:
        start, end = run_window(records)
        duration = end - start
    if duration < 0 or not math.isfinite(duration):
        raise ValueError(f"duration must be a finite number >= 0, got {duration}")

    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    queue_times: list[float] = []
    kv_waits: list[float] = []
    parts: dict[str, list[float]] = {part: [] for part in TTFT_PARTS}
    total_input = total_output = 0
    ok: list[tuple[RequestRecord, RequestLatencies]] = []
    for rec in records:
        lat = request_latencies(rec)
        if lat is None:
            continue
        ok.append((rec, lat))
        total_input += rec.prompt_len
        total_output += lat.output_len
        ttfts.append(lat.ttft)
        e2els.append(lat.e2el)
        itls.extend(lat.itls)
        if lat.tpot is not None:
            tpots.append(lat.tpot)
        if rec.queue_time is not None:
            queue_times.append(rec.queue_time)
        if rec.remote_kv_wait is not None:
            kv_waits.append(rec.remote_kv_wait)
        if rec.ttft_breakdown is not None:
            for part, values in parts.items():
                values.append(rec.ttft_breakdown.get(part, 0.0))

    def per_s(x: float) -> float:
        # vLLM divides blindly; a zero-length run reports zero throughput instead of crashing.
        return x / duration if duration > 0 else 0.0

    pcts = tuple(percentiles)
    lists = {
        "ttft": ttfts,
        "tpot": tpots,
        "itl": itls,
        "e2el": e2els,
        "queue_time": queue_times,
        "remote_kv_wait": kv_waits,
    }
    completed = len(ok)
    good = None
    if slo is not None:
        good = sum(1 for _, lat in ok if meets_slo(lat, slo))
    return ServeMetrics(
        num_requests=len(records),
        completed=completed,
        failed=len(records) - completed,
        num_unfinished=sum(1 for r in records if r.finish_reason is None),
        total_input_tokens=total_input,
        total_output_tokens=total_output,
        duration=float(duration),
        request_throughput=per_s(completed),
        output_throughput=per_s(total_output),
        total_token_throughput=per_s(total_input + total_output),
        max_concurrent_requests=max_overlap((r.arrival_time, r.arrival_time + lat.e2el) for r, lat in ok),
        max_output_tokens_per_s=_max_tokens_per_second(ok),
        percentiles=pcts,
        latencies={name: latency_stats(values, pcts) for name, values in lists.items()},
        ttft_breakdown={part: latency_stats(values, BREAKDOWN_PERCENTILES) for part, values in parts.items()},
        good=good,
    )


def meets_slo(lat: RequestLatencies, slo: Mapping[str, float]) -> bool:
    """Whether a completed request met every latency target (seconds)."""
    got = {"ttft": lat.ttft, "tpot": lat.tpot or 0.0, "e2el": lat.e2el}
    return all(got[k] <= target for k, target in slo.items())


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """Largest number of half-open [start, end) intervals covering one instant."""
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((end, -1))
    # At equal times the -1 sorts first: a request ending as another begins does not overlap it.
    events.sort()
    best = cur = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return best


def _max_tokens_per_second(ok: list[tuple[RequestRecord, RequestLatencies]]) -> float:
    """vLLM's peak output rate: tokens counted in whole-second buckets from the first arrival."""
    if not ok:
        return 0.0
    t0 = min(r.arrival_time for r, _ in ok)
    t_end = max(r.arrival_time + lat.e2el for r, lat in ok)
    n_buckets = int(np.ceil(t_end - t0)) + 1
    # One array op over every token instead of a Python loop (a run has millions):
    # bucket int(t - t0), truncation toward zero as `int` does, buckets in range only.
    times = np.fromiter(itertools.chain.from_iterable(rec.token_times for rec, _ in ok), dtype=float)
    b = np.trunc(times - t0)
    b = b[(b >= 0) & (b < n_buckets)].astype(np.int64)
    return float(np.bincount(b, minlength=n_buckets).max())


# ---- per-step aggregates -------------------------------------------------------------------------


def step_aggregates(steps: Sequence[StepRecord]) -> dict:
    """Scheduler-side aggregates: overall keys plus the same keys per node under `per_node`.

    Means are over steps (not time-weighted); maxima are over all steps of all nodes.
    KV usage is a fraction in [0, 1], like vLLM's `kv_cache_usage_perc`.
    """
    out = _aggregate(steps)
    by_node: dict[str, list[StepRecord]] = {}
    for s in steps:
        by_node.setdefault(s.node, []).append(s)
    if len(by_node) == 1:
        # One node: its aggregates are the overall ones (no second pass over every step).
        out["per_node"] = {node: dict(out) for node in by_node}
    else:
        out["per_node"] = {node: _aggregate(node_steps) for node, node_steps in sorted(by_node.items())}
    return out


# The step fields `_aggregate` reads, read together in one pass over the steps.
_AGGREGATED = (
    "num_running",
    "num_waiting",
    "num_waiting_for_remote_kvs",
    "num_deferred_blocks",
    "batches_in_flight",
    "batch_size",
    "num_scheduled_tokens",
    "num_prefill_tokens",
    "num_decode_tokens",
    "duration",
)


def _aggregate(steps: Sequence[StepRecord]) -> dict:
    if not steps:
        return {"num_steps": 0}
    table = np.asarray(list(map(operator.attrgetter(*_AGGREGATED), steps)), dtype=float)
    # Contiguous columns: sums and means add in the same order as over a 1-D array.
    columns = dict(zip(_AGGREGATED, np.ascontiguousarray(table.T)))

    def col(name: str) -> np.ndarray:
        return columns[name]

    kv = np.asarray([s.kv_usage for s in steps], dtype=float)
    return {
        "num_steps": len(steps),
        "mean_kv_usage": float(kv.mean()),
        "max_kv_usage": float(kv.max()),
        "mean_num_running": float(col("num_running").mean()),
        "max_num_running": int(col("num_running").max()),
        "mean_num_waiting": float(col("num_waiting").mean()),
        "max_num_waiting": int(col("num_waiting").max()),
        "max_num_waiting_for_remote_kvs": int(col("num_waiting_for_remote_kvs").max()),
        "max_num_deferred_blocks": int(col("num_deferred_blocks").max()),
        "max_batches_in_flight": int(col("batches_in_flight").max()),
        "mean_batch_size": float(col("batch_size").mean()),
        "total_scheduled_tokens": int(col("num_scheduled_tokens").sum()),
        "total_prefill_tokens": int(col("num_prefill_tokens").sum()),
        "total_decode_tokens": int(col("num_decode_tokens").sum()),
        "total_step_time": float(col("duration").sum()),
    }
