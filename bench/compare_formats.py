"""The comparison as text for other tools: Markdown (a PR comment, a
wiki), CSV (a spreadsheet, pandas: one row per variant and metric) and JSON
(`summary_json`'s document, on stdout). The terminal table is
bench/table_layout.py's."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

FORMATS = ("table", "markdown", "csv", "json")


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(
    title: str,
    metrics: Sequence[str],
    headers: Sequence[str],
    cells: Sequence[Sequence[tuple[str, str]]],
    outcomes: Sequence,
) -> str:
    """A GitHub-flavoured Markdown table (metric per row, as in the terminal), then the thresholds."""
    heads = [_md_escape(h.replace("\n", " ")) for h in headers]
    lines = [f"**{_md_escape(title)}**", "", "| metric | " + " | ".join(heads) + " |"]
    lines.append("|---|" + "---:|" * len(heads))
    for i, m in enumerate(metrics):
        row = [_md_escape(f"{v} {r}".strip()) for v, r in (col[i] for col in cells)]
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    if outcomes:
        lines += ["", "| result | threshold | lhs | rhs |", "|---|---|---:|---:|"]
        for o in outcomes:
            verdict = "PASS" if o.passed else "FAIL"
            note = f" ({o.note})" if o.note else ""
            lines.append(f"| {verdict} | `{_md_escape(o.text)}`{_md_escape(note)} | {o.lhs:g} | {o.rhs:g} |")
    return "\n".join(lines) + "\n"


def csv_rows(summary: dict) -> str:
    """`summary_json`'s cells as CSV: variant, metric, n, mean, std, ratio (empty: none)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["variant", "metric", "n", "mean", "std", "ratio"])
    for variant, row in summary["variants"].items():
        for metric, c in row.items():
            numbers = ("" if c[k] is None else repr(c[k]) for k in ("mean", "std", "ratio"))
            w.writerow([variant, metric, c["n"], *numbers])
    return buf.getvalue()


def json_text(summary: dict) -> str:
    return json.dumps(summary, indent=2) + "\n"
