"""One self-contained page per run: `report.html` next to the results.

The same table and thresholds the terminal showed (rendered by rich, so the
two never disagree), the invariant errors, where the results came from, and
every plot. Plots are linked relatively (`plots/*.png`), so the directory can
be moved or archived as a whole.
"""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Any

from rich.console import Console

from .breakdown_table import format_breakdown_table
from .compare import format_compare_table, format_threshold_table

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 1200px; }}
pre {{ font-size: 13px; line-height: 1.25; }}
.fail {{ color: #b00; }} .pass {{ color: #070; }}
img {{ max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }}
dt {{ font-weight: bold; float: left; clear: left; width: 9em; }} dd {{ margin-left: 10em; }}
</style></head><body>
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
<h2>Provenance</h2>
<dl>{provenance}</dl>
</body></html>
"""


def _rich_html(renderable: Any) -> str:
    console = Console(record=True, width=220, file=io.StringIO(), color_system="truecolor")
    console.print(renderable)
    return console.export_html(inline_styles=True, code_format="<pre>{code}</pre>")


def write_html_report(outcome: Any, scenario: Any, variants: list[str], provenance: dict | None) -> Path:
    """Write `report.html` into the outcome's directory and return its path."""
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
        "<h2>Thresholds</h2>" + _rich_html(format_threshold_table(outcome.threshold_outcomes))
        if outcome.threshold_outcomes
        else ""
    )
    invariants = ""
    if outcome.invariant_errors:
        items = "".join(f"<li>{html.escape(e)}</li>" for e in outcome.invariant_errors[:50])
        invariants = f"<h2>Invariant errors</h2><ul>{items}</ul>"
    plots = "\n".join(
        f'<figure><img src="{html.escape(p.relative_to(outcome.out_dir).as_posix())}" '
        f'alt="{html.escape(p.stem)}"></figure>'
        for p in outcome.plots
    )
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
        table=_rich_html(format_compare_table(baseline, metrics, table)),
        breakdown=(
            "<h2>TTFT breakdown</h2>" + _rich_html(format_breakdown_table(*outcome.breakdown))
            if outcome.breakdown is not None
            else ""
        ),
        thresholds=thresholds,
        invariants=invariants,
        plots=plots,
        provenance="".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in rows.items()),
    )
    path = outcome.out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
