"""PNG plots of a comparison: step time series and latency CDFs.

Every plot covers all repeats of every variant. Time series show, per
variant, the mean over repeats as a line and the min–max range over repeats
as a band, one panel per node (a prefill and a decode node have unrelated
KV pools). Each variant keeps one colour in every plot; the baseline is
black, thicker and drawn on top, so no other line hides it. Legends sit
outside the axes, and link outage windows are shaded. CDFs pool the
successful requests of all repeats (as the metrics do per run).
Matplotlib runs on the Agg backend so nothing needs a display.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bench.metrics import request_latencies  # noqa: E402
from engine.records import RequestRecord, StepRecord  # noqa: E402

GRID_POINTS = 400  # samples per time series (repeats are averaged on this grid)
BASELINE_COLOUR = "black"

StepFn = Callable[[StepRecord], float]
# variant -> one list of steps per repeat
StepsByVariant = Mapping[str, Sequence[Sequence[StepRecord]]]


def variant_colours(variants: Sequence[str], baseline: str | None = None) -> dict[str, Any]:  # matplotlib colours
    """One colour per variant, the same in every plot; the baseline black."""
    cmap = plt.get_cmap("tab10" if len(variants) <= 10 else "tab20")
    others = [v for v in variants if v != baseline]
    colours: dict[str, object] = {v: cmap(i % cmap.N) for i, v in enumerate(others)}
    if baseline is not None:
        colours[baseline] = BASELINE_COLOUR
    return colours


def _line_style(variant: str, baseline: str | None) -> dict:
    if variant == baseline:
        return {"linewidth": 2.2, "zorder": 5}
    return {"linewidth": 1.3, "zorder": 3}


def _shade_outages(ax, windows: Sequence[tuple[float, float]], t_end: float, label: bool) -> None:
    for i, (start, end) in enumerate(sorted(set(windows))):
        ax.axvspan(
            start,
            min(end, t_end) if np.isfinite(end) else t_end,
            color="tab:red",
            alpha=0.12,
            zorder=1,
            label="link outage" if label and i == 0 else None,
        )


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _legend_outside(fig, axes) -> None:
    handles, labels, seen = [], [], set()
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in seen:
                seen.add(lab)
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", frameon=False)


def _grid_index(steps: Sequence[StepRecord], grid: np.ndarray) -> np.ndarray:
    """For each grid time, the index of the last step at or before it (-1: none yet)."""
    t = np.asarray([s.time for s in steps])
    return np.searchsorted(t, grid, side="right") - 1


def _on_grid(steps: Sequence[StepRecord], fn: StepFn, grid: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """A step series (value holds until the next step) sampled on `grid`; NaN before its first step.
    `idx`: `_grid_index(steps, grid)`."""
    if not steps:
        return np.full(grid.shape, np.nan)
    v = np.asarray([fn(s) for s in steps], dtype=float)
    out = v[np.clip(idx, 0, None)]
    out[idx < 0] = np.nan
    return out


def _by_node(steps: Sequence[StepRecord]) -> dict[str, list[StepRecord]]:
    out: dict[str, list[StepRecord]] = {}
    for s in sorted(steps, key=lambda s: (s.node, s.time, s.step_index)):
        out.setdefault(s.node, []).append(s)
    return out


@dataclass
class _StepsByNode:
    """Each variant's repeats split by node (in time order), and the last step's
    time: worked out once for all of a run's step plots (a 10,000-request run
    has ~60,000 steps)."""

    per_variant_nodes: dict[str, list[dict[str, list[StepRecord]]]]
    t_end: float
    any_repeats: bool  # some variant has more than one repeat
    grid: np.ndarray
    # Per node's steps of one repeat (by identity): `_grid_index` of them, the same for every series.
    grid_index: dict[int, np.ndarray]

    @classmethod
    def of(cls, steps_by_variant: StepsByVariant) -> _StepsByNode:
        t_end = max((s.time for reps in steps_by_variant.values() for rep in reps for s in rep), default=1.0) or 1.0
        per_variant_nodes = {v: [_by_node(rep) for rep in reps] for v, reps in steps_by_variant.items()}
        grid = np.linspace(0.0, t_end, GRID_POINTS)
        index = {
            id(steps): _grid_index(steps, grid)
            for reps in per_variant_nodes.values()
            for by_node in reps
            for steps in by_node.values()
        }
        return cls(per_variant_nodes, t_end, any(len(r) > 1 for r in steps_by_variant.values()), grid, index)


def _series_plot(
    split: _StepsByNode,
    path: Path,
    title: str,
    ylabel: str,
    series: Sequence[tuple[str, StepFn, str]],
    baseline: str | None = None,
    outages: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> Path:
    per_variant_nodes, t_end, grid = split.per_variant_nodes, split.t_end, split.grid
    variants = list(per_variant_nodes)
    colours = variant_colours(variants, baseline)
    nodes = sorted({n for reps in per_variant_nodes.values() for r in reps for n in r})
    # A panel whose every line is one constant (a prefill node never preempts)
    # says nothing: it is left out, and the title says which were.
    flat = [n for n in nodes if _flat(split, n, series)]
    if flat and len(flat) < len(nodes):
        nodes = [n for n in nodes if n not in flat]
        title += f" (flat, not shown: {', '.join(flat)})"
    fig, axes = plt.subplots(
        max(len(nodes), 1), 1, figsize=(9, 2.6 * max(len(nodes), 1) + 0.6), sharex=True, squeeze=False
    )
    axes = axes[:, 0]
    windows = sorted({w for ws in (outages or {}).values() for w in ws})
    for ax, node in zip(axes, nodes or ["(no steps)"]):
        _shade_outages(ax, windows, t_end, label=ax is axes[0])
        # The baseline last: on top of every other variant.
        for variant in sorted(variants, key=lambda v: v == baseline):
            reps = [r[node] for r in per_variant_nodes[variant] if node in r]
            if not reps:
                continue
            for label, fn, style in series:
                stack = np.vstack([_on_grid(rep, fn, grid, split.grid_index[id(rep)]) for rep in reps])
                valid = ~np.all(np.isnan(stack), axis=0)
                with np.errstate(all="ignore"):
                    mean = np.nanmean(np.where(valid, stack, 0.0), axis=0)
                    lo, hi = (
                        np.nanmin(np.where(valid, stack, 0.0), axis=0),
                        np.nanmax(np.where(valid, stack, 0.0), axis=0),
                    )
                mean[~valid] = np.nan
                name = variant + (" (baseline)" if variant == baseline else "") + (f" {label}" if label else "")
                if len(reps) > 1:
                    name += f" (mean of {len(reps)})"
                ax.plot(
                    grid, mean, linestyle=style, color=colours[variant], label=name, **_line_style(variant, baseline)
                )
                if len(reps) > 1:
                    ax.fill_between(
                        grid, lo, hi, where=valid, color=colours[variant], alpha=0.15, linewidth=0, zorder=2
                    )
        ax.set_title(node, fontsize="medium", loc="left")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("time (s)")
    fig.suptitle(title + (" — band: min–max over repeats" if split.any_repeats else ""))
    fig.tight_layout()
    _legend_outside(fig, axes)
    return _save(fig, path)


def _flat(split: _StepsByNode, node: str, series: Sequence[tuple[str, StepFn, str]]) -> bool:
    """Every series of every variant on this node takes a single value."""
    values: set[float] = set()
    for reps in split.per_variant_nodes.values():
        for rep in reps:
            for _, fn, _ in series:
                values.update(fn(s) for s in rep.get(node, ()))
                if len(values) > 1:
                    return False
    return True


def _as_repeats(steps_by_variant: Mapping[str, Sequence]) -> StepsByVariant:
    """Accept variant -> steps (one repeat) or variant -> [steps per repeat]."""
    out = {}
    for v, x in steps_by_variant.items():
        out[v] = [x] if (not x or isinstance(x[0], StepRecord)) else list(x)
    return out


def plot_step_timeseries(
    steps_by_variant: Mapping[str, Sequence],
    out_dir: str | Path,
    baseline: str | None = None,
    outages: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> list[Path]:
    """kv_usage.png, running_waiting.png, preemptions.png and deferred_frees.png in out_dir.

    `steps_by_variant`: variant -> steps of one run, or variant -> [steps of each repeat]."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = _StepsByNode.of(_as_repeats(steps_by_variant))
    kw: dict[str, Any] = {"baseline": baseline, "outages": outages}
    return [
        _series_plot(
            data, out / "kv_usage.png", "KV cache usage", "fraction of blocks", [("", lambda s: s.kv_usage, "-")], **kw
        ),
        _series_plot(
            data,
            out / "running_waiting.png",
            "Running (solid) and waiting (dashed) requests",
            "requests",
            [
                ("running", lambda s: s.num_running, "-"),
                ("waiting", lambda s: s.num_waiting + s.num_waiting_for_remote_kvs, "--"),
            ],
            **kw,
        ),
        _series_plot(
            data,
            out / "preemptions.png",
            "Cumulative preemptions",
            "preemptions",
            [("", lambda s: s.num_preemptions_total, "-")],
            **kw,
        ),
        _series_plot(
            data,
            out / "deferred_frees.png",
            "Deferred-free blocks (solid) and cumulative zero-progress preemptions (dotted)",
            "blocks / preemptions",
            [
                ("deferred blocks", lambda s: s.num_deferred_blocks, "-"),
                ("zero-progress", lambda s: s.num_zero_progress_preemptions_total, ":"),
            ],
            **kw,
        ),
    ]


def _cdf_plot(
    values_by_variant: Mapping[str, Sequence[float]], path: Path, title: str, xlabel: str, baseline: str | None
) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = variant_colours(list(values_by_variant), baseline)
    for variant in sorted(values_by_variant, key=lambda v: v == baseline):
        values = values_by_variant[variant]
        if not values:
            continue
        xs = np.sort(np.asarray(values, dtype=float))
        ys = np.arange(1, len(xs) + 1) / len(xs)
        label = f"{variant}{' (baseline)' if variant == baseline else ''} (n={len(xs)})"
        ax.step(xs, ys, where="post", label=label, color=colours[variant], **_line_style(variant, baseline))
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    _legend_outside(fig, [ax])
    return _save(fig, path)


def plot_latency_cdfs(
    records_by_variant: Mapping[str, Sequence], out_dir: str | Path, baseline: str | None = None
) -> list[Path]:
    """ttft_cdf.png and e2el_cdf.png in out_dir (milliseconds); records of
    one run per variant, or a list of runs (pooled)."""
    ttft: dict[str, list[float]] = {}
    e2el: dict[str, list[float]] = {}
    for variant, runs in records_by_variant.items():
        runs = [runs] if (not runs or isinstance(runs[0], RequestRecord)) else runs
        lats = [lat for records in runs for lat in map(request_latencies, records) if lat is not None]
        ttft[variant] = [lat.ttft * 1000 for lat in lats]
        e2el[variant] = [lat.e2el * 1000 for lat in lats]
    return plot_latency_cdfs_ms(ttft, e2el, out_dir, baseline)


def plot_latency_cdfs_ms(
    ttft_ms_by_variant: Mapping[str, Sequence[float]],
    e2el_ms_by_variant: Mapping[str, Sequence[float]],
    out_dir: str | Path,
    baseline: str | None = None,
) -> list[Path]:
    """The same CDFs from ready-made millisecond lists (e.g. read back from result JSONs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [
        _cdf_plot(ttft_ms_by_variant, out / "ttft_cdf.png", "Time to first token (all repeats)", "TTFT (ms)", baseline),
        _cdf_plot(e2el_ms_by_variant, out / "e2el_cdf.png", "End-to-end latency (all repeats)", "E2EL (ms)", baseline),
    ]


def plot_scenario(
    runs: Mapping[tuple[str, int], object],
    variants: Sequence[str],
    baseline: str | None,
    out_dir: str | Path,
    outages: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> list[Path]:
    """Every plot of a scenario run from its RunResults ((variant, repeat) -> run)."""
    steps = {v: [r.steps for (rv, _), r in sorted(runs.items()) if rv == v] for v in variants}  # type: ignore[attr-defined]
    records = {v: [r.requests for (rv, _), r in sorted(runs.items()) if rv == v] for v in variants}  # type: ignore[attr-defined]
    return plot_step_timeseries(steps, out_dir, baseline, outages) + plot_latency_cdfs(records, out_dir, baseline)


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
