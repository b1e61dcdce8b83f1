"""The comparison table laid out for a terminal of any width.

One orientation everywhere (`run` and `compare`): a metric per row, a
variant per column, so the metric names read down the left and are never
cut. When the variants do not fit the width side by side, the table is
wrapped into several tables of as many variant columns as fit, each
repeating the metric column — never cutting a name, never squeezing a
header into three-letter pieces. Cells first try one line
(`mean ± std (×ratio)`), then two (the ratio below), before wrapping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rich.markup import escape
from rich.table import Table

# What rich adds to a column's content: one space of padding each side and a border.
_COLUMN_OVERHEAD = 3


class _Cell(Protocol):
    n: int


def _widths(lines: Sequence[str]) -> int:
    return max((len(part) for text in lines for part in text.split("\n")), default=0)


def _chunks(metric_width: int, widths: list[int], total: int) -> list[list[int]]:
    """Indices of the variant columns of each wrapped table (greedy, at least one each)."""
    out: list[list[int]] = [[]]
    used = metric_width + _COLUMN_OVERHEAD + 1
    for i, w in enumerate(widths):
        need = w + _COLUMN_OVERHEAD
        if out[-1] and used + need > total:
            out.append([])
            used = metric_width + _COLUMN_OVERHEAD + 1
        out[-1].append(i)
        used += need
    return out


def layout_tables(
    title: str,
    metrics: Sequence[str],
    headers: Sequence[str],
    cells: Sequence[Sequence[tuple[str, str]]],
    width: int,
) -> list[Table]:
    """Tables of `metrics` (rows) x `headers` (columns) that fit `width`.

    `cells[j][i]` is column j's (value, ratio) text for metric i; ratio ""
    when there is none."""
    metric_width = max((len(m) for m in metrics), default=6)
    one_line = [[v + (f" {r}" if r else "") for v, r in col] for col in cells]
    two_lines = [[v + (f"\n{r}" if r else "") for v, r in col] for col in cells]
    texts = one_line
    col_widths = [max(_widths(h.split("\n")), _widths(c)) for h, c in zip(headers, texts, strict=True)]
    if len(_chunks(metric_width, col_widths, width)) > 1:
        texts = two_lines
        col_widths = [max(_widths(h.split("\n")), _widths(c)) for h, c in zip(headers, texts, strict=True)]
    groups = _chunks(metric_width, col_widths, width)
    tables = []
    for k, group in enumerate(groups):
        part = f" ({k + 1}/{len(groups)})" if len(groups) > 1 else ""
        t = Table(title=title + part, title_justify="left")
        t.add_column("metric", style="bold", no_wrap=True, min_width=metric_width)
        for j in group:
            t.add_column(escape(headers[j]), justify="right", no_wrap=True, min_width=col_widths[j])
        for i, m in enumerate(metrics):
            t.add_row(m, *(texts[j][i] for j in group))
        tables.append(t)
    return tables
