"""`disagg-sim`: run scenarios, compare results.

disagg-sim run [SCENARIO | RESULT.json] [--runtime inproc|ray] [--set k=v ...] [--only VARIANT ...]
               [--address ADDR] [--net-delay MS] [--jitter MS] [--bandwidth MBPS] [--loss P]
               [--repeats N] [--jobs N] [--out DIR] [--overwrite] [--pace X] [--metrics-port PORT] [--log-stats [S]]
disagg-sim compare [LABEL=]RESULTS ... [--threshold EXPR ...] [--baseline VARIANT] [--metric M ...] [--json PATH]
disagg-sim validate SCENARIO
disagg-sim schema [--markdown | --json | --metrics SCENARIO]
disagg-sim scenarios
disagg-sim serve [SCENARIO] [--runtime inproc|ray] [--address ADDR] [--host 127.0.0.1] [--port 8000]
                 [--model-name NAME] [--time-scale X] [--variant V] [--max-pending N]
disagg-sim tokenizer DIR
disagg-sim validate-cost [--only ID ...] [--fit | --render-only] [--out MD] [--results JSON]
disagg-sim --version

Exit codes: 0 all thresholds pass; 1 a threshold failed; 2 bad input (one
line on stderr says what, where and what is allowed); 3 a run broke an
invariant; 4 the simulator itself failed (a bug: the traceback is saved).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import NoReturn

import yaml
from rich.console import Console

from .bounded_yaml import safe_load_bounded
from .compare_formats import FORMATS
from .errors import InputError, one_line

DEFAULT_SCENARIO = "cascade"
EXIT_BAD_INPUT = 2
EXIT_CRASH = 4
# Files a run writes into its directory; --overwrite removes exactly these.
BY_NODE_HELP = (
    "after each variant, a column per node (variant@node: its counters and step figures; thresholds can name "
    "metric[variant@node] too)"
)
# The results directory of the command being run, once there is one (`_crash_report`).
_RUN_DIR: dict[str, Path] = {}
RUN_OUTPUTS = ("*__r*.json", "*__r*.steps.jsonl", "v0_report.json", "report.html", "plots", "error.log")


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line and exit code 2 (no usage block),
    with "did you mean" for an unknown flag; abbreviations are off, so
    `--repeat` is refused rather than silently taken as `--repeats`."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._argv: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        message += _flag_suggestion(self, message)
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _flag_suggestion(parser: _Parser, message: str) -> str:
    """'; did you mean --net-delay?' for the first unknown flag, from the
    flags of the subcommand it was given to."""
    from .errors import did_you_mean

    if not message.startswith("unrecognized arguments:"):
        return ""
    unknown = [w.split("=", 1)[0] for w in message.split(":", 1)[1].split() if w.startswith("--")]
    if not unknown:
        return ""
    flags = {o for a in parser._actions for o in a.option_strings}
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        choices = getattr(action, "choices", None) or {}
        command = next((w for w in parser._argv if w in choices), None)
        if command is not None:
            flags |= {o for a in choices[command]._actions for o in a.option_strings}
    return did_you_mean(unknown[0], sorted(f for f in flags if f.startswith("--")))


class _PipeConsole(Console):
    """rich's Console exits 1 when its reader goes away; here that is the
    reader's choice (`| head`), so it ends the command like any other closed
    pipe: exit 0 (`main`)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def _console() -> Console:
    """The terminal's width; when stdout is not a terminal, $COLUMNS if set,
    else 160 (a log or CI page is wider than rich's default 80)."""
    import os

    wide = sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit()
    return _PipeConsole(width=None if wide else 160)


def _number(kind: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False):
    """An argparse type: a finite int/float within [lo, hi] (lo excluded with lo_open)."""

    def parse(text: str):
        try:
            value = int(text) if kind == "int" else float(text)
        except ValueError:
            what = "an integer" if kind == "int" else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        ok = math.isfinite(value) and (lo is None or (value > lo if lo_open else value >= lo))
        ok = ok and (hi is None or value <= hi)
        if not ok:
            rng = f"{'>' if lo_open else '>='} {lo:g}" if lo is not None else ""
            rng += (" and " if rng and hi is not None else "") + (f"<= {hi:g}" if hi is not None else "")
            raise argparse.ArgumentTypeError(f"{text} is out of range; allowed: a finite number {rng}")
        return value

    parse.__name__ = kind  # argparse names the type in its messages
    return parse


def _parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "\x00" in item:
            raise InputError(f"--set {item!r}: holds a NUL byte; allowed: printable key=value")
        if "=" not in item:
            raise InputError(f"--set {item!r}: expected KEY=VALUE, e.g. cluster.decode.engine.num_gpu_blocks=256")
        key, value = item.split("=", 1)
        key = key.strip()
        try:
            out[key] = safe_load_bounded(value) if value.strip() else ""
        except yaml.YAMLError as exc:
            raise InputError(f"--set {item!r}: the value is not valid YAML ({one_line(str(exc))})") from None
    return out


def _link_overrides(args) -> tuple[dict, dict]:
    out, origins = {}, {}
    for flag, field in (
        ("net_delay", "delay_ms"),
        ("jitter", "jitter_ms"),
        ("bandwidth", "bandwidth_MBps"),
        ("loss", "loss"),
    ):
        value = getattr(args, flag)
        if value is not None:
            key = f"cluster.links.kv.{field}"
            out[key] = value
            origins[key] = f"--{flag.replace('_', '-')} {value:g}"
    return out, origins


def _load_for_run(target: str):
    """A scenario file or name, or a results JSON (re-run its scenario exactly)."""
    from .rerun import is_result_file, scenario_from_result
    from .scenario import load_scenario

    if is_result_file(target):
        return scenario_from_result(target)
    return load_scenario(target)


def prepare_out_dir(out: str | None, scenario_name: str, overwrite: bool) -> Path:
    """A fresh directory for the run: `results/<scenario>-<time>` (never one
    that exists), or `--out DIR`, which must be new or empty unless --overwrite
    (then only the files a run writes are removed from it)."""
    if out is not None:
        if "\x00" in out:
            raise InputError(f"--out {out!r}: holds a NUL byte; allowed: a directory path")
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise InputError(f"--out {out}: is a file; allowed: a new or empty directory")
        if path.is_dir() and any(path.iterdir()):
            if not overwrite:
                raise InputError(
                    f"--out {out}: already holds files (a previous run?); allowed: a new or empty directory, "
                    "or --overwrite to replace that run's results"
                )
            for pattern in RUN_OUTPUTS:
                for old in path.glob(pattern):
                    shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path("results") / f"{scenario_name}-{stamp}"
        n = 2
        while path.exists():
            path = Path("results") / f"{scenario_name}-{stamp}-{n}"
            n += 1
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {path}: cannot create the directory ({exc.strerror or exc})") from None
    try:
        # An existing directory on a read-only mount (or not ours) fails here,
        # before the first run, not when the results are written.
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        why = exc.strerror or exc
        raise InputError(f"--out {path}: cannot write there ({why}); allowed: a writable directory") from None
    return path


def cmd_run(args) -> int:
    from . import provenance
    from .memory_estimate import check_run_memory
    from .runner import run_scenario
    from .sweep import check_jobs

    console = _console()
    scenario = _load_for_run(args.scenario)
    overrides = _parse_set(args.set or [])
    origins = {k: f"--set {k}" for k in overrides}
    links, link_origins = _link_overrides(args)
    overrides.update(links)
    origins.update(link_origins)
    if args.repeats is not None:
        overrides["repeats"] = args.repeats
        origins["repeats"] = f"--repeats {args.repeats}"
    if overrides:
        scenario = scenario.with_overrides(overrides, origins)
    for name in args.only or []:
        if name not in scenario.variant_names:
            from .errors import did_you_mean

            raise InputError(
                f"--only {name}: not a variant of {scenario.name}{did_you_mean(name, scenario.variant_names)}; "
                f"allowed: {', '.join(scenario.variant_names)}"
            )
    runtime = args.runtime or scenario.file.runtime
    if args.pace is not None and runtime != "inproc":
        raise InputError(
            f"--pace {args.pace:g}: only in-process runs have a virtual clock to pace; allowed: runtime inproc"
        )
    check_jobs(args.jobs, runtime, args.metrics_port, args.log_stats, args.pace)
    check_run_memory(args.max_memory, scenario, args.only, args.jobs, lambda line: console.print(line, markup=False))
    out = prepare_out_dir(args.out, scenario.name, args.overwrite)
    _RUN_DIR["out"] = out  # a crash after this point leaves its traceback beside the results
    variants = args.only or scenario.variant_names
    console.print(
        f"[bold]{scenario.name}[/]: {len(variants)} variant(s) × {scenario.file.repeats} repeat(s) "
        f"on {runtime}"
        + (f" ({args.address})" if args.address else "")
        + (f", {args.jobs} at once" if args.jobs > 1 else ""),
        highlight=False,
    )
    if scenario.file.description:
        console.print(scenario.file.description.strip(), markup=False)
    if runtime == "inproc":
        scales = sorted({scenario.cluster(v).time_scale for v in variants} - {1.0})
        if scales:
            console.print(
                f"note: cluster.time_scale={', '.join(f'{x:g}' for x in scales)} is a Ray setting (wall seconds slept "
                "per modelled second); in-process runs use the virtual clock and ignore it"
                + ("" if args.pace else " (use --pace to watch a run in real time)"),
                markup=False,
                highlight=False,
            )
    if args.log_stats:
        import logging

        logging.basicConfig(
            level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s", datefmt="%m-%d %H:%M:%S"
        )
    outcome = run_scenario(
        scenario,
        runtime=runtime,
        out_dir=out,
        console=console,
        address=args.address,
        debug_invariants=args.debug_invariants,
        metrics_port=args.metrics_port,
        log_interval=args.log_stats,
        hold_metrics=args.hold_metrics,
        provenance=provenance.collect(),
        only=args.only,
        pace=args.pace,
        jobs=args.jobs,
        breakdown=args.breakdown,
        by_node=args.by_node,
    )
    clock = outcome.results[0]["clock"] if outcome.results else "?"
    described = {
        "virtual": "virtual, deterministic",
        "wall": "wall, steps slept at time_scale x modelled; latencies and throughputs in model time"
        " = wall / time_scale",
    }
    console.print(f"clock: {clock} ({described.get(clock, clock)})")
    return outcome.exit_code


def cmd_compare(args) -> int:
    from .compare import main_compare
    from .compare_page import write_compare_page

    console = _console()
    return main_compare(
        args.results,
        args.threshold or [],
        args.baseline,
        args.metric or None,
        console=console,
        json_path=args.json,
        fmt=args.format,
        err_console=Console(stderr=True, width=100000),
        by_node=args.by_node,
        html_path=args.html,
        write_page=write_compare_page,
    )


def cmd_validate(args) -> int:
    from .scenario import load_scenario

    s = load_scenario(args.scenario)
    print(
        f"{s.name}: ok ({len(s.variants)} variants: {', '.join(s.variant_names)}; runtime {s.file.runtime}; "
        f"{s.file.repeats} repeat(s); {len(s.file.thresholds)} threshold(s))"
    )
    return 0


def cmd_schema(args) -> int:
    from .schema_doc import reference, scenario_json_schema

    if args.metrics:
        from .scenario import load_scenario

        print("\n".join(sorted(load_scenario(args.metrics).known_metrics())))
    elif args.glossary:
        from .metric_glossary import documented_names, render_markdown

        print(render_markdown(documented_names()), end="")
    elif args.json:
        import json

        print(json.dumps(scenario_json_schema(), indent=2))
    else:
        print(reference(), end="")
    return 0


def cmd_scenarios(args) -> int:
    from .scenario import builtin_scenarios, load_scenario

    for name in builtin_scenarios():
        s = load_scenario(name)
        first = (s.file.description.strip().splitlines() or [""])[0]
        print(f"{name:24s} {s.file.runtime:7s} {first}")
    return 0


def cmd_serve(args) -> int:
    from .serve.cli import serve_command

    return serve_command(args)


def cmd_tokenizer(args) -> int:
    from .serve.cli import tokenizer_command

    return tokenizer_command(args)


def build_parser() -> argparse.ArgumentParser:
    from .provenance import tool_version

    p = _Parser(prog="disagg-sim", description="Disaggregated LLM serving simulator (vLLM scheduler model).")
    p.add_argument("--version", action="version", version=f"disagg-sim {tool_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run a scenario (default: the built-in cross-process cascade)")
    r.add_argument(
        "scenario",
        nargs="?",
        default=DEFAULT_SCENARIO,
        help="a scenario file, a built-in name, or a results JSON (re-runs its scenario exactly)",
    )
    r.add_argument("--runtime", choices=["inproc", "ray"], help="override the scenario's runtime")
    r.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a setting, e.g. cluster.decode.engine.num_gpu_blocks=256 (refused if a variant sets it too)",
    )
    r.add_argument("--only", action="append", metavar="VARIANT", help="run only this variant (repeatable)")
    r.add_argument("--address", help="attach to an existing Ray cluster (default: launch a local one on 127.0.0.1)")
    r.add_argument("--net-delay", type=_number("float", 0), metavar="MS", help="KV link one-way delay")
    r.add_argument("--jitter", type=_number("float", 0), metavar="MS", help="KV link delay jitter")
    r.add_argument("--bandwidth", type=_number("float", 0, lo_open=True), metavar="MBPS", help="KV link cap, MB/s")
    r.add_argument("--loss", type=_number("float", 0, 0.999999), metavar="P", help="KV link message loss probability")
    r.add_argument("--repeats", type=_number("int", 1, 1000), help="override the number of repeats")
    r.add_argument(
        "--jobs",
        type=_number("int", 1, 64),
        default=1,
        metavar="N",
        help="in-process only: run up to N of the variant x repeat runs at once, in worker processes "
        "(same results; default 1)",
    )
    r.add_argument(
        "--breakdown",
        action="store_true",
        help="also print the TTFT breakdown: mean ms per part of the first token's path (docs/cost-model.md)",
    )
    r.add_argument("--by-node", action="store_true", help=BY_NODE_HELP)
    r.add_argument("--out", help="output directory (default: a new results/<scenario>-<time>)")
    r.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="refuse a run estimated above SIZE (e.g. 4G, 512M), warn above half of it "
        "(default: this machine's memory; 'off' skips the check; docs/usage.md)",
    )
    r.add_argument("--overwrite", action="store_true", help="let --out name a directory that holds a previous run")
    r.add_argument("--debug-invariants", action="store_true", help="check block conservation after every step")
    r.add_argument(
        "--pace",
        type=_number("float", 0, 1e6, lo_open=True),
        metavar="X",
        help="in-process only: hold the virtual clock to X times real time (1 = real time), for dashboards",
    )
    r.add_argument(
        "--metrics-port",
        type=_number("int", 0, 65535),
        metavar="PORT",
        help="serve a Prometheus /metrics endpoint per node on 127.0.0.1 for the whole run, series labelled "
        "with the variant (0 = ephemeral; node i gets PORT+i)",
    )
    r.add_argument(
        "--hold-metrics",
        type=_number("float", 0, 86400),
        default=0.0,
        metavar="S",
        help="keep /metrics up S seconds after the runs",
    )
    r.add_argument(
        "--log-stats",
        type=_number("float", 0, 86400, lo_open=True),
        nargs="?",
        const=5.0,
        metavar="S",
        help="print vLLM-style stats lines per node every S seconds of the run's clock (default 5)",
    )
    r.set_defaults(func=cmd_run)
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
    c.add_argument("--baseline", metavar="VARIANT", help="the variant ratios are taken against (default: the first)")
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
    v = sub.add_parser("validate", help="check a scenario completely (traces, thresholds, sizes) without running it")
    v.add_argument("scenario")
    v.set_defaults(func=cmd_validate)
    sc = sub.add_parser("schema", help="the scenario format reference (Markdown), its JSON schema, or metric names")
    g = sc.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="the JSON schema of a scenario file")
    g.add_argument("--metrics", metavar="SCENARIO", help="every metric name this scenario's results carry")
    g.add_argument(
        "--glossary", action="store_true", help="every metric's definition, unit and vLLM equivalent (docs/metrics.md)"
    )
    sc.set_defaults(func=cmd_schema)
    s = sub.add_parser("scenarios", help="list the built-in scenarios")
    s.set_defaults(func=cmd_scenarios)
    from .calibrate import add_calibrate_parser

    add_calibrate_parser(sub)
    from .validation.cli import add_validate_cost_parser

    add_validate_cost_parser(sub)
    from .serve.cli import add_serve_parsers

    add_serve_parsers(sub, _number, cmd_serve, cmd_tokenizer)
    return p


def _crash_report(exc: BaseException, out: Path | None) -> str:
    """Save the traceback of an unexpected error; return where it went."""
    text = "".join(traceback.format_exception(exc))
    try:
        if out is not None:
            path = Path(out) / "error.log"
        else:
            fd, name = tempfile.mkstemp(prefix="disagg-sim-error-", suffix=".log")
            path = Path(name)
            import os

            os.close(fd)
        path.write_text(text)
        return str(path)
    except OSError:
        return "(could not be saved)"


def _quiet_closed_pipe() -> int:
    """The reader went away (`disagg-sim ... | head`): stop writing, exit 0 as
    `head` users expect. stdout is pointed at /dev/null so the interpreter's
    final flush does not raise the same error again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        return _quiet_closed_pipe()
    except InputError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from .sweep import RunCrashed

        crashed = isinstance(exc, RunCrashed)
        error = exc.error if isinstance(exc, RunCrashed) else exc
        where = _crash_report(error, getattr(exc, "out_dir", None) or _RUN_DIR.get("out"))
        what = str(exc) if crashed else f"{type(exc).__name__}: {exc}"
        print(
            f"error: the simulator failed (a bug, not your input): {one_line(what)}; traceback in {where}",
            file=sys.stderr,
        )
        return EXIT_CRASH


if __name__ == "__main__":
    sys.exit(main())
