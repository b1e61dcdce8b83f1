"""One self-contained page per run: `report.html` next to the results.

The same table and thresholds the terminal showed, as HTML tables built
from the same cells (bench/compare.py's `FittedTable`, so the two never
disagree), the invariant errors, where the results came from, and the
interactive figures (bench/report_figures.py) with plotly's JavaScript
inlined: one file that opens anywhere, with no network. The PNGs stay in
`plots/` for slides and issues.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .breakdown_table import format_breakdown_table
from .compare import FittedTable, format_compare_table

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
{style}</style>
<script>{plotlyjs}</script>
</head><body>
<h1>{title}</h1>
<p>{description}</p>
<p class="{verdict_class}"><b>{verdict}</b></p>
<h2>Results</h2>
{table}
{breakdown}
{thresholds}
{invariants}
<h2>Plots</h2>
{plots}
<p>PNG versions: <code>plots/</code>.</p>
<h2>Provenance</h2>
<dl>{provenance}</dl>
</body></html>
"""


# The page's look, shared with `compare --html` (bench/compare_page.py).
STYLE = """body { font-family: system-ui, sans-serif; margin: 2em; max-width: 1400px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 14px; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; }
th { background: #f4f4f4; text-align: right; vertical-align: bottom; }
td { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th.metric, td.metric { text-align: left; font-family: ui-monospace, monospace; }
td.expr { text-align: left; font-family: ui-monospace, monospace; white-space: normal; }
.ratio { color: #666; }
.fail { color: #b00; } .pass { color: #070; }
figure { margin: 1em 0; }
dt { font-weight: bold; float: left; clear: left; width: 9em; } dd { margin-left: 10em; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def compare_table_html(fitted: FittedTable) -> str:
    """The comparison table as HTML: a metric per row, a variant per column."""
    heads = "".join(f"<th>{'<br>'.join(_e(p) for p in h.split(chr(10)))}</th>" for h in fitted.headers)
    rows = []
    for i, metric in enumerate(fitted.metrics):
        cells = []
        for col in fitted.cells:
            value, ratio = col[i]
            cells.append(f"<td>{_e(value)}" + (f' <span class="ratio">{_e(ratio)}</span>' if ratio else "") + "</td>")
        rows.append(f'<tr><td class="metric">{_e(metric)}</td>{"".join(cells)}</tr>')
    return (
        f'<p>{_e(fitted.title)}</p><table class="results"><thead><tr><th class="metric">metric</th>{heads}</tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table>"
    )


def threshold_table_html(outcomes: Sequence[Any]) -> str:
    rows = []
    for o in outcomes:
        verdict = '<td class="pass">PASS</td>' if o.passed else '<td class="fail">FAIL</td>'
        note = f' <span class="fail">({_e(o.note)})</span>' if o.note else ""
        rows.append(f'<tr>{verdict}<td class="expr">{_e(o.text)}{note}</td><td>{o.lhs:g}</td><td>{o.rhs:g}</td></tr>')
    return (
        '<table class="thresholds"><thead><tr><th class="metric">result</th><th class="metric">threshold</th>'
        f"<th>lhs</th><th>rhs</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def figures_html(figures: Sequence[Any]) -> str:
    import plotly.io as pio

    return "\n".join(
        "<figure>"
        + pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"figure-{i}", config={"responsive": True})
        + "</figure>"
        for i, fig in enumerate(figures)
    )


def write_html_report(
    outcome: Any, scenario: Any, variants: list[str], provenance: dict | None, outages: dict | None = None
) -> Path:
    """Write `report.html` into the outcome's directory and return its path."""
    from plotly.offline import get_plotlyjs

    from .report_figures import report_figures

    assert outcome.out_dir is not None and outcome.table is not None
    baseline, metrics, table = outcome.table
    failed = [o for o in outcome.threshold_outcomes if not o.passed]
    if outcome.invariant_errors:
        verdict, cls = f"{len(outcome.invariant_errors)} invariant error(s): the run broke (exit 3)", "fail"
    elif failed:
        verdict, cls = f"{len(failed)} of {len(outcome.threshold_outcomes)} threshold(s) failed (exit 1)", "fail"
    else:
        verdict, cls = f"all {len(outcome.threshold_outcomes)} threshold(s) passed (exit 0)", "pass"
    thresholds = (
        "<h2>Thresholds</h2>" + threshold_table_html(outcome.threshold_outcomes) if outcome.threshold_outcomes else ""
    )
    invariants = ""
    if outcome.invariant_errors:
        items = "".join(f"<li>{html.escape(e)}</li>" for e in outcome.invariant_errors[:50])
        invariants = f"<h2>Invariant errors</h2><ul>{items}</ul>"
    figures = report_figures(outcome.runs, outcome.results, variants, baseline, outages)
    prov = provenance or {}
    git = prov.get("git") or {}
    rows = {
        "scenario": scenario.source,
        "variants": ", ".join(variants),
        "repeats": str(scenario.file.repeats),
        "seeds": f"{scenario.file.seed} .. {scenario.file.seed + scenario.file.repeats - 1}",
        "overrides": ", ".join(f"{k}={v!r}" for k, v in scenario.overrides.items()) or "none",
        "tool": f"disagg-sim {prov.get('version', '?')}",
        "commit": f"{git.get('commit') or 'unknown'}{' (local changes)' if git.get('dirty') else ''}",
        "python": str(prov.get("python", "?")),
        "libraries": ", ".join(f"{k} {v}" for k, v in (prov.get("libraries") or {}).items() if v),
        "machine": ", ".join(f"{k} {v}" for k, v in (prov.get("machine") or {}).items()),
        "command": " ".join(prov.get("argv") or []),
        "started": str(prov.get("started_at", "?")),
    }
    page = _PAGE.format(
        title=html.escape(f"{scenario.name}: {len(variants)} variant(s) x {scenario.file.repeats} repeat(s)"),
        description=html.escape(scenario.file.description.strip()),
        verdict=html.escape(verdict),
        verdict_class=cls,
        table=compare_table_html(format_compare_table(baseline, metrics, table)),
        breakdown=(
            "<h2>TTFT breakdown</h2>" + compare_table_html(format_breakdown_table(*outcome.breakdown))
            if outcome.breakdown is not None
            else ""
        ),
        thresholds=thresholds,
        invariants=invariants,
        plots=figures_html(figures),
        plotlyjs=get_plotlyjs(),
        style=STYLE,
        provenance="".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in rows.items()),
    )
    path = outcome.out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
