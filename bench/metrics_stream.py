"""Serving metrics of a fleet run without its records (docs/fleet.md): the
finished requests' records arrive in batches (`InProcCluster(stream=...)`)
and are folded into what the metrics need, then dropped.

What is kept per request is a few numbers (8 bytes each): its arrival, TTFT,
E2EL, TPOT, queue time, remote-KV wait and TTFT parts, so every per-request
statistic is the one `compute_metrics` (bench/metrics.py) gives: the same
values, put back in arrival order, through the same `latency_stats`. The
inter-token latencies (a run has one per token: 10^8 of them) are counted
instead, a table of distinct gap -> count; their statistics are worked out
from the table (numpy's linear-interpolation percentile, the mean and
population std over the counted values), equal to the listed values' up
to the last bits of the sums. Should the table grow past `ITL_MAX_KEYS`
distinct gaps (jittered links make every gap distinct), gaps are kept to 4
significant digits from then on, and the result says so
(`itl_rounded_to_digits`). `max_output_tokens_per_s` buckets token times by
whole seconds from the workload's first arrival (`t0`): `compute_metrics`
counts from the first successful request's arrival, the same unless the
very first request failed.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import numpy as np

from engine.records import RequestRecord
from proxy.breakdown import PARTS as TTFT_PARTS

from .metrics import BREAKDOWN_PERCENTILES, DEFAULT_PERCENTILES, LatencyStats, latency_stats, percentile_word

ITL_MAX_KEYS = 1_000_000
_COARSE_DIGITS = 4

_PER_REQUEST = ("ttft", "tpot", "e2el", "queue_time", "remote_kv_wait")


class StreamedMetrics:
    def __init__(self, t0: float = 0.0) -> None:
        self.t0 = t0
        self.num_requests = 0
        self.completed = 0
        self.num_unfinished = 0
        self.total_input_tokens = 0
        self.total_output_tokens = 0
        self.finish_reasons: dict[str, int] = {}
        # Per request: (arrival order key, value); a list's values come back in arrival order.
        self._values: dict[str, tuple[array, array]] = {
            name: (array("d"), array("d")) for name in (*_PER_REQUEST, *(f"ttft_{p}" for p in TTFT_PARTS))
        }
        self._spans = (array("d"), array("d"))  # (arrival, end) of each successful request
        self.itl_counts: dict[float, int] = {}
        self.itl_rounded = False
        self._tokens_per_s = np.zeros(0, dtype=np.int64)

    # -- folding records in ----------------------------------------------------------------
    def add(self, batch: Sequence[RequestRecord]) -> None:
        gaps: list[np.ndarray] = []
        token_times: list[np.ndarray] = []
        for rec in batch:
            self.num_requests += 1
            reason = rec.finish_reason or "unfinished"
            self.finish_reasons[reason] = self.finish_reasons.get(reason, 0) + 1
            if rec.finish_reason is None:
                self.num_unfinished += 1
            if not rec.succeeded:
                continue
            times = rec.token_times
            n = len(times)
            arrival = rec.arrival_time
            ttft = times[0] - arrival
            end = rec.finish_time if rec.finish_time is not None else times[-1]
            e2el = end - arrival
            self.completed += 1
            self.total_input_tokens += rec.prompt_len
            self.total_output_tokens += n
            self._put("ttft", arrival, ttft)
            self._put("e2el", arrival, e2el)
            if n > 1:
                self._put("tpot", arrival, (e2el - ttft) / (n - 1))
                t = np.asarray(times, dtype=float)
                gaps.append(t[1:] - t[:-1])
                token_times.append(t)
            else:
                token_times.append(np.asarray(times, dtype=float))
            if rec.queue_time is not None:
                self._put("queue_time", arrival, rec.queue_time)
            if rec.remote_kv_wait is not None:
                self._put("remote_kv_wait", arrival, rec.remote_kv_wait)
            if rec.ttft_breakdown is not None:
                for part in TTFT_PARTS:
                    self._put(f"ttft_{part}", arrival, rec.ttft_breakdown.get(part, 0.0))
            self._spans[0].append(arrival)
            self._spans[1].append(arrival + e2el)
        if gaps:
            self._count_gaps(np.concatenate(gaps))
        if token_times:
            self._count_tokens(np.concatenate(token_times))

    def _put(self, name: str, arrival: float, value: float) -> None:
        keys, values = self._values[name]
        keys.append(arrival)
        values.append(value)

    def _count_gaps(self, gaps: np.ndarray) -> None:
        if self.itl_rounded:
            gaps = _round_significant(gaps)
        values, counts = np.unique(gaps, return_counts=True)
        table = self.itl_counts
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            table[v] = table.get(v, 0) + c
        if len(table) > ITL_MAX_KEYS and not self.itl_rounded:
            self.itl_rounded = True
            coarse: dict[float, int] = {}
            keys = _round_significant(np.fromiter(table, dtype=float, count=len(table))).tolist()
            for k, c in zip(keys, table.values(), strict=True):
                coarse[k] = coarse.get(k, 0) + c
            self.itl_counts = coarse

    def _count_tokens(self, times: np.ndarray) -> None:
        b = np.trunc(times - self.t0)
        b = b[b >= 0].astype(np.int64)
        if not len(b):
            return
        counts = np.bincount(b)
        if len(counts) > len(self._tokens_per_s):
            counts[: len(self._tokens_per_s)] += self._tokens_per_s
            self._tokens_per_s = counts
        else:
            self._tokens_per_s[: len(counts)] += counts

    # -- the metrics -------------------------------------------------------------------------
    def values(self, name: str) -> list[float]:
        """A per-request list, in arrival order (as compute_metrics lists it)."""
        keys, values = self._values[name]
        k = np.frombuffer(keys, dtype=float) if len(keys) else np.zeros(0)
        v = np.frombuffer(values, dtype=float) if len(values) else np.zeros(0)
        return v[np.argsort(k, kind="stable")].tolist()

    def itl_stats(self, percentiles: Sequence[float]) -> LatencyStats:
        if not self.itl_counts:
            return latency_stats([], percentiles)
        values = np.fromiter(self.itl_counts, dtype=float, count=len(self.itl_counts))
        counts = np.fromiter(self.itl_counts.values(), dtype=np.int64, count=len(self.itl_counts))
        order = np.argsort(values)
        values, counts = values[order], counts[order]
        n = int(counts.sum())
        cum = np.cumsum(counts)
        mean = float(np.dot(values, counts) / n)
        std = float(math.sqrt(float(np.dot((values - mean) ** 2, counts)) / n))

        def at(rank: int) -> float:
            return float(values[int(np.searchsorted(cum, rank, side="right"))])

        def percentile(p: float) -> float:
            rank = p / 100 * (n - 1)
            lo, hi = math.floor(rank), math.ceil(rank)
            a, b = at(lo), at(hi)
            return a + (b - a) * (rank - lo)

        return LatencyStats(
            count=n,
            mean_ms=mean * 1000,
            median_ms=percentile(50) * 1000,
            std_ms=std * 1000,
            percentiles_ms={p: percentile(p) * 1000 for p in percentiles},
        )

    def max_concurrent_requests(self) -> int:
        starts = np.frombuffer(self._spans[0], dtype=float) if len(self._spans[0]) else np.zeros(0)
        ends = np.frombuffer(self._spans[1], dtype=float) if len(self._spans[1]) else np.zeros(0)
        if not len(starts):
            return 0
        times = np.concatenate([starts, ends])
        deltas = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
        order = np.lexsort((deltas, times))  # by time; at equal times an end (-1) first
        return int(np.cumsum(deltas[order]).max())

    def to_dict(self, duration: float, percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float | int]:
        """`ServeMetrics.to_dict`'s keys, from what was folded in."""

        def per_s(x: float) -> float:
            return x / duration if duration > 0 else 0.0

        pcts = tuple(percentiles)
        out: dict[str, float | int] = {
            "duration": float(duration),
            "num_requests": self.num_requests,
            "completed": self.completed,
            "failed": self.num_requests - self.completed,
            "num_unfinished": self.num_unfinished,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": per_s(self.completed),
            "output_throughput": per_s(self.total_output_tokens),
            "total_token_throughput": per_s(self.total_input_tokens + self.total_output_tokens),
            "max_concurrent_requests": self.max_concurrent_requests(),
            "max_output_tokens_per_s": float(self._tokens_per_s.max()) if len(self._tokens_per_s) else 0.0,
        }
        for name in ("ttft", "tpot", "itl", "e2el", "queue_time", "remote_kv_wait"):
            stats = self.itl_stats(pcts) if name == "itl" else latency_stats(self.values(name), pcts)
            out.update(stats.to_keys(name))
        for part in TTFT_PARTS:
            stats = latency_stats(self.values(f"ttft_{part}"), BREAKDOWN_PERCENTILES)
            name = f"ttft_{part}"
            out[f"mean_{name}_ms"] = stats.mean_ms
            out[f"median_{name}_ms"] = stats.median_ms
            out[f"p{percentile_word(99)}_{name}_ms"] = stats.percentiles_ms[99]
        if self.itl_rounded:
            out["itl_rounded_to_digits"] = _COARSE_DIGITS
        return out


def _round_significant(x: np.ndarray) -> np.ndarray:
    """Each value to `_COARSE_DIGITS` significant digits (0 stays 0)."""
    with np.errstate(divide="ignore"):
        mag = np.floor(np.log10(np.abs(x)))
    mag = np.where(np.isfinite(mag), mag, 0)
    scale = 10.0 ** (_COARSE_DIGITS - 1 - mag)
    return np.round(x * scale) / scale
