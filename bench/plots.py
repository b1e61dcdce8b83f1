"""PNG plots of a comparison: step time series and latency CDFs, one line per variant.

Time series come from StepRecords (one line per variant and node, since a
prefill and a decode node have unrelated KV pools); CDFs come from request
records (successful requests only, as in the metrics). Matplotlib runs on the
Agg backend so nothing needs a display.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bench.metrics import request_latencies  # noqa: E402
from engine.records import RequestRecord, StepRecord  # noqa: E402


def _by_node(steps: Sequence[StepRecord]) -> dict[str, list[StepRecord]]:
    out: dict[str, list[StepRecord]] = {}
    for s in sorted(steps, key=lambda s: (s.node, s.time, s.step_index)):
        out.setdefault(s.node, []).append(s)
    return out


def _finish(fig, ax, path: Path, title: str, xlabel: str, ylabel: str, legend_loc: str) -> Path:
    """Labels, grid, legend (when anything was drawn), save and close."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small", loc=legend_loc)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _series_plot(
    steps_by_variant: Mapping[str, Sequence[StepRecord]],
    path: Path,
    title: str,
    ylabel: str,
    series: Sequence[tuple[str, Callable[[StepRecord], float], str]],
) -> Path:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for variant, steps in steps_by_variant.items():
        nodes = _by_node(steps)
        for node, node_steps in nodes.items():
            t = [s.time for s in node_steps]
            for label, fn, style in series:
                name = f"{variant}/{node}" if len(nodes) > 1 else variant
                if label:
                    name += f" {label}"
                ax.step(t, [fn(s) for s in node_steps], where="post", linestyle=style, label=name)
    return _finish(fig, ax, path, title, "time (s)", ylabel, "best")


def plot_step_timeseries(steps_by_variant: Mapping[str, Sequence[StepRecord]], out_dir: str | Path) -> list[Path]:
    """kv_usage.png, running_waiting.png and preemptions.png in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [
        _series_plot(
            steps_by_variant,
            out / "kv_usage.png",
            "KV cache usage",
            "fraction of blocks in use",
            [("", lambda s: s.kv_usage, "-")],
        ),
        _series_plot(
            steps_by_variant,
            out / "running_waiting.png",
            "Running and waiting requests",
            "requests",
            [
                ("running", lambda s: s.num_running, "-"),
                ("waiting", lambda s: s.num_waiting + s.num_waiting_for_remote_kvs, "--"),
            ],
        ),
        _series_plot(
            steps_by_variant,
            out / "preemptions.png",
            "Cumulative preemptions",
            "preemptions",
            [
                ("all", lambda s: s.num_preemptions_total, "-"),
                ("zero-progress", lambda s: s.num_zero_progress_preemptions_total, ":"),
            ],
        ),
    ]


def _cdf_plot(values_by_variant: Mapping[str, Sequence[float]], path: Path, title: str, xlabel: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, values in values_by_variant.items():
        if not values:
            continue
        xs = np.sort(np.asarray(values, dtype=float))
        ys = np.arange(1, len(xs) + 1) / len(xs)
        ax.step(xs, ys, where="post", label=f"{variant} (n={len(xs)})")
    ax.set_ylim(0, 1.02)
    return _finish(fig, ax, path, title, xlabel, "fraction of requests", "lower right")


def plot_latency_cdfs(records_by_variant: Mapping[str, Sequence[RequestRecord]], out_dir: str | Path) -> list[Path]:
    """ttft_cdf.png and e2el_cdf.png in out_dir (milliseconds)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ttft: dict[str, list[float]] = {}
    e2el: dict[str, list[float]] = {}
    for variant, records in records_by_variant.items():
        lats = [lat for lat in map(request_latencies, records) if lat is not None]
        ttft[variant] = [lat.ttft * 1000 for lat in lats]
        e2el[variant] = [lat.e2el * 1000 for lat in lats]
    return plot_latency_cdfs_ms(ttft, e2el, out)


def plot_latency_cdfs_ms(
    ttft_ms_by_variant: Mapping[str, Sequence[float]],
    e2el_ms_by_variant: Mapping[str, Sequence[float]],
    out_dir: str | Path,
) -> list[Path]:
    """The same CDFs from ready-made millisecond lists (e.g. read back from result JSONs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [
        _cdf_plot(ttft_ms_by_variant, out / "ttft_cdf.png", "Time to first token", "TTFT (ms)"),
        _cdf_plot(e2el_ms_by_variant, out / "e2el_cdf.png", "End-to-end latency", "E2EL (ms)"),
    ]


def latencies_ms_from_results(results: Sequence[dict]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Pool per-request TTFT/E2EL (ms) by variant over repeats, from results built with include_requests."""
    ttft: dict[str, list[float]] = {}
    e2el: dict[str, list[float]] = {}
    for r in results:
        for req in r.get("requests") or []:
            if req.get("success"):
                ttft.setdefault(r["variant"], []).append(req["ttft_ms"])
                e2el.setdefault(r["variant"], []).append(req["e2el_ms"])
    return ttft, e2el
