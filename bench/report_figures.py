"""The report's interactive figures (plotly), for report.html.

Why plotly: one well-kept library that writes a figure as JSON and ships its
own JavaScript bundle inside the wheel (`plotly.offline.get_plotlyjs()`), so
the page is one self-contained file that opens with no network — hover,
zoom and legend toggling included. (Vega-Lite would need three separate
JavaScript bundles that no Python package ships together.)

The same data as the PNGs (bench/plots.py: mean over repeats on a common
time grid, min–max band), with what a page can do better: a node panel
whose lines are all flat is dropped (a prefill node never preempts), a
figure with nothing but flat panels is dropped, the baseline is drawn last
and black so no line hides it, and the integrity counters that tell the
variants apart (fence-off's KV corruptions, the cascade's zero-progress
preemptions) get a figure of their own.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.colors import to_hex
from plotly.subplots import make_subplots

from bench.metrics import request_latencies

from .plots import StepFn, _flat, _on_grid, _StepsByNode, variant_colours

STEP_FIGURES: list[tuple[str, str, list[tuple[str, StepFn, str]]]] = [
    ("KV cache usage", "fraction of blocks", [("", lambda s: s.kv_usage, "solid")]),
    (
        "Running (solid) and waiting (dashed) requests",
        "requests",
        [
            ("running", lambda s: s.num_running, "solid"),
            ("waiting", lambda s: s.num_waiting + s.num_waiting_for_remote_kvs, "dash"),
        ],
    ),
    ("Cumulative preemptions", "preemptions", [("", lambda s: s.num_preemptions_total, "solid")]),
    (
        "Deferred-free blocks (solid) and cumulative zero-progress preemptions (dotted)",
        "blocks / preemptions",
        [
            ("deferred blocks", lambda s: s.num_deferred_blocks, "solid"),
            ("zero-progress", lambda s: s.num_zero_progress_preemptions_total, "dot"),
        ],
    ),
]
INTEGRITY_METRICS = ("kv_corruptions_detected", "num_zero_progress_preemptions")


def _colours(variants: Sequence[str], baseline: str | None) -> dict[str, str]:
    return {v: to_hex(c) for v, c in variant_colours(list(variants), baseline).items()}


def _baseline_last(variants: Sequence[str], baseline: str | None) -> list[str]:
    return sorted(variants, key=lambda v: v == baseline)


def step_figure(
    split: _StepsByNode,
    title: str,
    ylabel: str,
    series: list[tuple[str, StepFn, str]],
    baseline: str | None,
    windows: Sequence[tuple[float, float]],
) -> go.Figure | None:
    """One panel per node that is not flat; None when every node is."""
    nodes = sorted({n for reps in split.per_variant_nodes.values() for r in reps for n in r})
    nodes = [n for n in nodes if not _flat(split, n, series)]
    if not nodes:
        return None
    variants = list(split.per_variant_nodes)
    colours = _colours(variants, baseline)
    fig = make_subplots(rows=len(nodes), cols=1, shared_xaxes=True, subplot_titles=nodes, vertical_spacing=0.08)
    for row, node in enumerate(nodes, start=1):
        for variant in _baseline_last(variants, baseline):
            reps = [r[node] for r in split.per_variant_nodes[variant] if node in r]
            if not reps:
                continue
            for label, fn, dash in series:
                stack = np.vstack([_on_grid(rep, fn, split.grid, split.grid_index[id(rep)]) for rep in reps])
                with warnings.catch_warnings():  # a grid point before any repeat's first step is NaN, as meant
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mean, lo, hi = np.nanmean(stack, 0), np.nanmin(stack, 0), np.nanmax(stack, 0)
                name = variant + (" (baseline)" if variant == baseline else "") + (f" {label}" if label else "")
                group = f"{variant}/{label}"
                line = {"color": colours[variant], "dash": dash, "width": 3 if variant == baseline else 1.5}
                if len(reps) > 1:
                    band = {"x": split.grid, "mode": "lines", "line": {"width": 0}, "legendgroup": group}
                    fig.add_trace(go.Scatter(y=lo, showlegend=False, hoverinfo="skip", **band), row=row, col=1)
                    fig.add_trace(
                        go.Scatter(
                            y=hi, fill="tonexty", fillcolor=_translucent(colours[variant]), showlegend=False,
                            hoverinfo="skip", **band,
                        ),
                        row=row, col=1,
                    )  # fmt: skip
                fig.add_trace(
                    go.Scatter(
                        x=split.grid, y=mean, mode="lines", name=name, line=line, legendgroup=group,
                        showlegend=row == 1,
                    ),
                    row=row, col=1,
                )  # fmt: skip
        fig.update_yaxes(title_text=ylabel, row=row, col=1)
        for start, end in windows:
            fig.add_vrect(x0=start, x1=end, fillcolor="grey", opacity=0.15, line_width=0, row=row, col=1)
    fig.update_xaxes(title_text="time (s)", row=len(nodes), col=1)
    band_note = " — band: min–max over repeats" if split.any_repeats else ""
    fig.update_layout(title=title + band_note, height=120 + 260 * len(nodes), legend={"x": 1.02, "y": 1})
    return fig


def _translucent(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},0.15)"


def cdf_figure(values_by_variant: Mapping[str, list[float]], title: str, xlabel: str, baseline: str | None):
    variants = [v for v, xs in values_by_variant.items() if xs]
    if not variants:
        return None
    colours = _colours(list(values_by_variant), baseline)
    fig = go.Figure()
    for variant in _baseline_last(variants, baseline):
        xs = np.sort(np.asarray(values_by_variant[variant], dtype=float))
        ys = np.arange(1, len(xs) + 1) / len(xs)
        name = variant + (" (baseline)" if variant == baseline else "")
        width = 3 if variant == baseline else 1.5
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name, line={"color": colours[variant], "width": width}))
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title="fraction of requests", height=420)
    return fig


def integrity_figure(results: Sequence[dict], variants: Sequence[str], baseline: str | None) -> go.Figure | None:
    """Per variant, each repeat's integrity counters as bars: the fence-off
    corruptions and the cascade's zero-progress preemptions side by side."""
    metrics = [m for m in INTEGRITY_METRICS if any(r.get(m) for r in results)]
    if not metrics:
        return None
    colours = _colours(variants, baseline)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=metrics)
    for col, metric in enumerate(metrics, start=1):
        for variant in variants:
            reps = sorted((r["repeat"], r.get(metric) or 0) for r in results if r["variant"] == variant)
            fig.add_trace(
                go.Bar(
                    x=[f"{variant} r{rep}" for rep, _ in reps], y=[v for _, v in reps], name=variant,
                    marker_color=colours[variant], legendgroup=variant, showlegend=col == 1,
                ),
                row=1, col=col,
            )  # fmt: skip
    fig.update_layout(title="Integrity: KV corruptions and zero-progress preemptions per run", height=420)
    return fig


def report_figures(runs, results: Sequence[dict], variants: Sequence[str], baseline: str | None, outages) -> list:
    """Every non-empty figure of a scenario run, in page order."""
    steps = {v: [r.steps for (rv, _), r in sorted(runs.items()) if rv == v] for v in variants}
    split = _StepsByNode.of(steps)
    windows = sorted({w for ws in (outages or {}).values() for w in ws})
    figures = [step_figure(split, t, y, s, baseline, windows) for t, y, s in STEP_FIGURES]
    figures.append(integrity_figure(results, variants, baseline))
    ttft: dict[str, list[float]] = {}
    e2el: dict[str, list[float]] = {}
    for v in variants:
        for (rv, _), run in sorted(runs.items()):
            if rv == v:
                lats = [lat for lat in map(request_latencies, run.requests) if lat is not None]
                ttft.setdefault(v, []).extend(lat.ttft * 1000 for lat in lats)
                e2el.setdefault(v, []).extend(lat.e2el * 1000 for lat in lats)
    figures.append(cdf_figure(ttft, "Time to first token (all repeats)", "TTFT (ms)", baseline))
    figures.append(cdf_figure(e2el, "End-to-end latency (all repeats)", "E2EL (ms)", baseline))
    return [f for f in figures if f is not None]
