"""`disagg-sim compare`: results side by side; thresholds set the exit code."""

from __future__ import annotations

from rich.console import Console

from ..compare_formats import FORMATS
from .parsing import BY_NODE_HELP, console


def add_parser(sub) -> None:
    c = sub.add_parser(
        "compare",
        help="compare results JSON files; thresholds set the exit code",
        description="Put runs side by side: a metric per row, a variant per column (mean ± std over repeats, "
        "ratio of means against the baseline; docs/metrics.md defines every metric). Exit 0 when every threshold "
        "passes, 1 when one fails, 2 on bad input.",
    )
    c.add_argument(
        "results",
        nargs="+",
        help="result files or directories; LABEL=PATH to compare sets (e.g. base=results/a cand=results/b)",
    )
    c.add_argument(
        "--threshold",
        action="append",
        metavar="EXPR",
        help="e.g. 'num_preemptions[prefix] / num_preemptions[fixed] >= 5' (repeatable; docs/metrics.md)",
    )
    c.add_argument(
        "--baseline",
        metavar="VARIANT",
        help="the variant ratios are taken against (default: the scenario's report.baseline, else its first variant; "
        "of the first set, with LABEL=PATH sets)",
    )
    c.add_argument("--metric", action="append", metavar="M", help="show only this metric (repeatable)")
    c.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (fitted to the terminal width), markdown, csv (a row per variant and metric) or json",
    )
    c.add_argument("--json", metavar="PATH", help="also write a machine-readable summary (for CI)")
    c.add_argument("--by-node", action="store_true", help=BY_NODE_HELP)
    c.add_argument(
        "--html",
        metavar="PAGE",
        help="also write the comparison as one self-contained page: tables and a chart per metric of every run",
    )
    c.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from ..compare import main_compare
    from ..compare_page import write_compare_page

    return main_compare(
        args.results,
        args.threshold or [],
        args.baseline,
        args.metric or None,
        console=console(),
        json_path=args.json,
        fmt=args.format,
        err_console=Console(stderr=True, width=100000),
        by_node=args.by_node,
        html_path=args.html,
        write_page=write_compare_page,
    )
