"""`compare --html PAGE`: the comparison as one self-contained page — the
table and thresholds as HTML tables (bench/html_report.py's), and per
metric a chart of every run of every variant side by side, so two result
sets (`base=… cand=…`) can be looked at and shared like a run's report.
Plotly's JavaScript is inlined (no network), as in report.html."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from .errors import InputError

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>{style}</style>
<script>{plotlyjs}</script>
</head><body>
<h1>{title}</h1>
{table}
{thresholds}
<h2>Every run, per metric</h2>
{figures}
</body></html>
"""


def metric_figure(results: Sequence[dict], metric: str, variants: Sequence[str], baseline: str):
    """One bar per run (variant × repeat), grouped by variant; the baseline black."""
    import plotly.graph_objects as go
    from matplotlib.colors import to_hex

    from .plots import variant_colours

    colours = {v: to_hex(c) for v, c in variant_colours(list(variants), baseline).items()}
    fig = go.Figure()
    for variant in variants:
        runs = sorted((r["repeat"], r.get(metric)) for r in results if r["variant"] == variant)
        runs = [(rep, v) for rep, v in runs if isinstance(v, (int, float))]
        if runs:
            fig.add_trace(
                go.Bar(
                    x=[variant] * len(runs), y=[v for _, v in runs], name=variant, marker_color=colours[variant],
                    text=[f"r{rep}" for rep, _ in runs], offsetgroup=variant,
                )
            )  # fmt: skip
    if not fig.data:
        return None
    fig.update_layout(title=metric, height=360, barmode="group", showlegend=False, yaxis_title=metric)
    return fig


def write_compare_page(
    path: str, results: Sequence[dict], fitted, outcomes: Sequence, metrics: Sequence[str], baseline: str
) -> None:
    from plotly.offline import get_plotlyjs

    from .html_report import STYLE, compare_table_html, figures_html, threshold_table_html

    variants = list(dict.fromkeys(r["variant"] for r in results))
    figures = [f for f in (metric_figure(results, m, variants, baseline) for m in metrics) if f is not None]
    page = _PAGE.format(
        title=html.escape(f"comparison of {len(variants)} variant(s)"),
        style=STYLE,
        plotlyjs=get_plotlyjs(),
        table=compare_table_html(fitted),
        thresholds="<h2>Thresholds</h2>" + threshold_table_html(outcomes) if outcomes else "",
        figures=figures_html(figures),
    )
    try:
        Path(path).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise InputError(
            f"--html {path}: cannot write ({exc.strerror or exc}); allowed: a writable file path"
        ) from None
