"""The TTFT breakdown side by side: mean TTFT and the mean of each of its
parts (proxy/breakdown.py) per variant, over repeats. Means add up: the
parts' means sum to the mean TTFT of the requests that have a breakdown.
`disagg-sim run --breakdown` prints it; report.html always shows it."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.breakdown import PARTS

from .compare import Cell, FittedTable, format_compare_table, summarize


def breakdown_metrics() -> list[str]:
    return ["mean_ttft_ms", *(f"mean_ttft_{part}_ms" for part in PARTS)]


def breakdown_table(results: Sequence[dict], baseline: str | None) -> tuple[str, list[str], dict[str, dict[str, Cell]]]:
    """(baseline, metrics, variant -> metric -> Cell), as `summarize` gives them."""
    return summarize(results, baseline, breakdown_metrics())


def format_breakdown_table(baseline: str, metrics: Sequence[str], table: dict[str, dict[str, Cell]]) -> FittedTable:
    t = format_compare_table(baseline, metrics, table)
    t.title = f"TTFT breakdown: mean ms per part (they add up to mean_ttft_ms); {t.title}"
    return t
