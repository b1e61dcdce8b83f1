"""Compare variants across repeats: the side-by-side table, two labelled
result sets (baseline build vs candidate build) and the machine-readable
summary for CI.

Table: for every metric, each variant's mean ± sample std over its repeats,
and for non-baseline variants the ratio of its mean to the baseline's mean —
the same number a threshold `metric[variant] / metric[baseline]` computes
(`ratio_of_means`, bench/thresholds.py), so the table and the thresholds
never disagree. Thresholds are `bench/thresholds.py`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.errors import InputError, did_you_mean, one_line
from bench.per_node import SEP, by_node_results, split_variant
from bench.results import ResultsError, is_number, load_results

from .compare_baseline import in_scenario_order
from .table_layout import layout_tables
from .thresholds import (
    ThresholdError,
    ThresholdOutcome,
    evaluate_thresholds,
    group_by_variant,
    metric_values,
    ratio_of_means,
    sample_std,
)

DEFAULT_TABLE_METRICS = (
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
    "max_concurrent_requests",
    "num_preemptions",
    "num_zero_progress_preemptions",
    "num_allocate_slots_calls",
    "deferred_free_blocks_peak",
    "num_blocks_freed_by_drain",
    "kv_corruptions_detected",
    "mean_kv_usage",
    "max_kv_usage",
)

# ---- summary table -------------------------------------------------------------------------------


@dataclass
class Cell:
    mean: float
    std: float
    n: int
    ratio: float | None = None  # ratio of means vs baseline; None for the baseline itself


def summarize(
    results: Sequence[dict],
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    baseline_of: dict[str, str] | None = None,
    by_node: bool = False,
) -> tuple[str, list[str], dict[str, dict[str, Cell]]]:
    """(baseline, metrics, variant -> metric -> Cell). Metrics default to the usual set present.

    `baseline_of` gives a variant its own baseline (labelled result sets:
    `candidate/fixed` against `baseline/fixed`); the others use `baseline`.
    `by_node`: after each variant, a column per node (`variant@node`,
    bench/per_node.py) with the metrics a node has, against the same node of
    the baseline."""
    groups = group_by_variant(results)
    if not groups:
        raise ResultsError("no results to compare")
    baseline = baseline or next(iter(groups))
    if baseline not in groups:
        raise ResultsError(
            f"unknown baseline variant {baseline!r}{did_you_mean(baseline, groups)}; known: {', '.join(groups)}"
        )
    baseline_of = dict(baseline_of or {})
    if metrics is None:
        metrics = [m for m in DEFAULT_TABLE_METRICS if all(is_number(r.get(m)) for r in results)]
    columns = list(groups)
    if by_node:
        node_groups = group_by_variant(by_node_results(results))
        columns = [c for v in groups for c in (v, *(n for n in node_groups if split_variant(n)[0] == v))]
        for column in node_groups:
            variant, node = split_variant(column)
            baseline_of[column] = f"{baseline_of.get(variant, baseline)}{SEP}{node}"
        groups = {**groups, **node_groups}
    table: dict[str, dict[str, Cell]] = {}
    for variant in columns:
        row: dict[str, Cell] = {}
        for m in metrics:
            base_variant = baseline_of.get(variant, baseline)
            if SEP in variant and not all(is_number(r.get(m)) for r in groups[variant].values()):
                continue  # a node has no such figure (TTFT is the client's)
            try:
                vals = metric_values(groups, m, variant)
            except ThresholdError as exc:
                raise ResultsError(str(exc)) from None
            xs = list(vals.values())
            cell = Cell(float(np.mean(xs)), sample_std(xs), len(xs))
            if variant != base_variant and base_variant in groups:
                base = metric_values(groups, m, base_variant)
                # The ratio of the means: what a threshold `m[variant] / m[baseline]` computes.
                cell.ratio = ratio_of_means(xs, list(base.values()))
            row[m] = cell
        table[variant] = row
    return baseline, list(metrics), table


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if abs(x) < 1e-9:  # float noise from unit conversions (e.g. a std of 8e-14 ms)
        return "0"
    if x == int(x) and abs(x) < 1e9:
        return str(int(x))
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"


def _cell_parts(c: Cell | None) -> tuple[str, str]:
    if c is None:  # a metric this column does not have (a node has no TTFT of its own)
        return "-", ""
    return f"{_fmt(c.mean)} ± {_fmt(c.std)}", (f"(×{_fmt(c.ratio)})" if c.ratio is not None else "")


def _cell_text(c: Cell) -> str:
    value, ratio = _cell_parts(c)
    return f"{value} {ratio}".strip()


class FittedTable:
    """The comparison table, laid out when printed for the width it gets
    (bench/table_layout.py): the same orientation in `run` and `compare`."""

    def __init__(self, title: str, metrics: Sequence[str], headers: list[str], cells: list[list[tuple[str, str]]]):
        self.title, self.metrics, self.headers, self.cells = title, list(metrics), headers, cells

    def tables(self, width: int) -> list[Table]:
        return layout_tables(self.title, self.metrics, self.headers, self.cells, width)

    def __rich_console__(self, console, options):
        yield from self.tables(options.max_width)


def format_compare_table(
    baseline: str, metrics: Sequence[str], table: dict[str, dict[str, Cell]], baseline_of: dict[str, str] | None = None
) -> FittedTable:
    """A metric per row, a variant per column, wrapped into several tables
    when the variants do not fit side by side; names are never cut."""
    against = f"vs {baseline}"
    if baseline_of:  # labelled sets: the first set's own variants are against its baseline
        against = f"vs the same variant of the first set (the first set's vs {baseline})"
    title = f"mean ± std over repeats; (×r) = ratio of means {against}"
    headers, cells = [], []
    for variant, row in table.items():
        n = max((c.n for c in row.values()), default=0)
        mark = "\n(baseline)" if variant == baseline else ""
        # `variant@node` on two lines (`@node` below): narrower, and neither part cut.
        headers.append(f"{variant.replace(SEP, chr(10) + SEP)}{mark}\nn={n}")
        cells.append([_cell_parts(row.get(m)) for m in metrics])
    return FittedTable(title, metrics, headers, cells)


def format_threshold_table(outcomes: Sequence[ThresholdOutcome]) -> Table:
    t = Table(title="thresholds")
    t.add_column("result")
    t.add_column("threshold", overflow="fold")
    t.add_column("lhs", justify="right")
    t.add_column("rhs", justify="right")
    for o in outcomes:
        verdict = "[green]PASS[/]" if o.passed else "[red]FAIL[/]"
        text = escape(o.text) + (f" [red]({escape(o.note)})[/]" if o.note else "")
        t.add_row(verdict, text, _fmt(o.lhs), _fmt(o.rhs))
    return t


def split_label(arg: str) -> tuple[str | None, str]:
    """`LABEL=PATH` -> (label, path); a plain path -> (None, path)."""
    label, sep, path = arg.partition("=")
    if sep and label and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", label):
        return label, path
    return None, arg


def load_labelled(paths: Sequence[str]) -> tuple[list[dict], dict[str, str], list[str]]:
    """Results of every path; with `LABEL=PATH` arguments each result's
    variant becomes `LABEL/variant`, and each such variant is paired with the
    same variant of the first label's set (its baseline). Returns (results,
    baseline_of, labels)."""
    results: list[dict] = []
    labels: list[str] = []
    for arg in paths:
        label, path = split_label(arg)
        loaded = in_scenario_order(load_results([path]))
        if label is not None:
            if label not in labels:
                labels.append(label)
            loaded = [dict(r, variant=f"{label}/{r['variant']}") for r in loaded]
        results.extend(loaded)
    baseline_of: dict[str, str] = {}
    if labels:
        first = labels[0]
        for r in results:
            v = r["variant"]
            _, _, plain = v.partition("/")
            if not v.startswith(first + "/") and f"{first}/{plain}" in {x["variant"] for x in results}:
                baseline_of[v] = f"{first}/{plain}"
    return results, baseline_of, labels


def _json_number(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else (x if math.isfinite(x) else (1e308 if x > 0 else -1e308))


def summary_json(
    baseline: str,
    metrics: Sequence[str],
    table: dict[str, dict[str, Cell]],
    outcomes: Sequence[ThresholdOutcome],
    baseline_of: dict[str, str],
    exit_code: int,
) -> dict:
    """The comparison for machines (CI): every cell and every threshold; NaN is null."""
    return {
        "schema": "disagg-sim.compare/1",
        "baseline": baseline,
        "baseline_of": baseline_of,
        "metrics": list(metrics),
        "variants": {
            v: {
                m: {"mean": _json_number(c.mean), "std": _json_number(c.std), "n": c.n, "ratio": _json_number(c.ratio)}
                for m, c in row.items()
            }
            for v, row in table.items()
        },
        "thresholds": [
            {
                "threshold": o.text,
                "passed": o.passed,
                "lhs": _json_number(o.lhs),
                "rhs": _json_number(o.rhs),
                "note": o.note,
            }
            for o in outcomes
        ],
        "passed": sum(o.passed for o in outcomes),
        "failed": sum(not o.passed for o in outcomes),
        "exit_code": exit_code,
    }


def main_compare(
    paths: Sequence[str],
    thresholds: Sequence[str] = (),
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    console: Console | None = None,
    json_path: str | None = None,
    fmt: str = "table",
    err_console: Console | None = None,
    by_node: bool = False,
    html_path: str | None = None,
    write_page: Callable[..., None] | None = None,
) -> int:
    """CLI body: 0 when every threshold passes, 1 when one fails, 2 on bad input.

    Paths are result files or directories, each optionally `LABEL=PATH`:
    `compare base=results/a cand=results/b` puts two builds side by side
    (variants `base/fixed`, `cand/fixed`, ...; ratios against `base/`).
    `fmt`: the terminal table, or markdown / csv / json (bench/compare_formats.py).
    Bad input is one line on `err_console` (the CLI's stderr, so a JSON or CSV
    reader never gets it), by default `console`."""
    import json as _json

    console = console or Console()
    try:
        results, baseline_of, labels = load_labelled(paths)
        if baseline is None:
            from .compare_baseline import default_baseline

            baseline = default_baseline(results, labels)
        base, names, table = summarize(results, baseline, metrics, baseline_of, by_node)
        outcomes = evaluate_thresholds(results, thresholds)
    except InputError as exc:
        (err_console or console).print(f"[red]error:[/] {escape(one_line(str(exc)))}", highlight=False, soft_wrap=True)
        return 2
    failed = [o for o in outcomes if not o.passed]
    code = 1 if failed else 0
    doc = summary_json(base, names, table, outcomes, baseline_of, code)
    fitted = format_compare_table(base, names, table, baseline_of)
    if fmt == "table":
        console.print(fitted)
        if outcomes:
            console.print(format_threshold_table(outcomes))
        console.print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed", highlight=False)
    else:
        from . import compare_formats

        text = {
            "markdown": lambda: compare_formats.markdown(fitted.title, names, fitted.headers, fitted.cells, outcomes),
            "csv": lambda: compare_formats.csv_rows(doc),
            "json": lambda: compare_formats.json_text(doc),
        }[fmt]()
        console.file.write(text)
        console.file.flush()
    if html_path is not None:
        # The page writer comes from the caller (bench/compare_page.py): the
        # page renders these tables, so importing it here would be circular.
        assert write_page is not None, "--html needs the page writer"
        write_page(html_path, results, fitted, outcomes, names, base)
    if json_path is not None:
        try:
            Path(json_path).write_text(_json.dumps(doc, indent=2) + "\n")
        except OSError as exc:
            raise ResultsError(f"--json {json_path}: cannot write ({exc.strerror or exc})") from None
    return code
