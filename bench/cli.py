"""`disagg-sim`: run scenarios, compare results.

disagg-sim run [SCENARIO] [--runtime inproc|ray] [--set k=v ...] [--address ADDR]
               [--net-delay MS] [--jitter MS] [--bandwidth MBPS] [--loss P]
               [--repeats N] [--out DIR]
disagg-sim compare RESULT.json ... [--threshold EXPR ...] [--baseline VARIANT]
disagg-sim validate SCENARIO
disagg-sim scenarios
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console

DEFAULT_SCENARIO = "cascade"


def _parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set {item!r}: expected key=value, e.g. cluster.decode.engine.num_gpu_blocks=256")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


def _link_overrides(args) -> dict:
    out = {}
    for flag, field in (
        ("net_delay", "delay_ms"),
        ("jitter", "jitter_ms"),
        ("bandwidth", "bandwidth_MBps"),
        ("loss", "loss"),
    ):
        value = getattr(args, flag)
        if value is not None:
            out[f"cluster.links.kv.{field}"] = value
    return out


def cmd_run(args) -> int:
    from .runner import run_scenario
    from .scenario import ScenarioError, load_scenario

    console = Console()
    try:
        scenario = load_scenario(args.scenario)
        overrides = {**_parse_set(args.set or []), **_link_overrides(args)}
        if args.repeats is not None:
            overrides["repeats"] = args.repeats
        if overrides:
            scenario = scenario.with_overrides(overrides)
    except ScenarioError as exc:
        console.print(f"[red]error:[/] {exc}", markup=True, highlight=False)
        return 2
    runtime = args.runtime or scenario.file.runtime
    out = Path(args.out) if args.out else Path("results") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(
        f"[bold]{scenario.name}[/]: {len(scenario.variants)} variant(s) × {scenario.file.repeats} repeat(s) "
        f"on {runtime}" + (f" ({args.address})" if args.address else "")
    )
    if scenario.file.description:
        console.print(scenario.file.description.strip(), markup=False)
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
    )
    clock = outcome.results[0]["clock"] if outcome.results else "?"
    console.print(
        f"clock: {clock} ({'virtual, deterministic' if clock == 'virtual' else 'wall, scaled by time_scale'})"
    )
    return outcome.exit_code


def cmd_compare(args) -> int:
    from .compare import main_compare

    return main_compare(args.results, args.threshold or [], args.baseline, args.metric or None)


def cmd_validate(args) -> int:
    from .scenario import ScenarioError, load_scenario

    try:
        s = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{s.name}: ok ({len(s.variants)} variants: {', '.join(s.variant_names)}; runtime {s.file.runtime})")
    return 0


def cmd_scenarios(args) -> int:
    from .scenario import builtin_scenarios, load_scenario

    for name in builtin_scenarios():
        s = load_scenario(name)
        first = (s.file.description.strip().splitlines() or [""])[0]
        print(f"{name:24s} {s.file.runtime:7s} {first}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="disagg-sim", description="Disaggregated LLM serving simulator (vLLM scheduler model)."
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a scenario (default: the built-in cross-process cascade)")
    r.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO, help="a scenario file or a built-in name")
    r.add_argument("--runtime", choices=["inproc", "ray"], help="override the scenario's runtime")
    r.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a setting, e.g. cluster.decode.engine.num_gpu_blocks=256",
    )
    r.add_argument("--address", help="attach to an existing Ray cluster (default: launch a local one on 127.0.0.1)")
    r.add_argument("--net-delay", type=float, metavar="MS", help="KV link one-way delay")
    r.add_argument("--jitter", type=float, metavar="MS", help="KV link delay jitter")
    r.add_argument("--bandwidth", type=float, metavar="MBPS", help="KV link bandwidth cap, MB/s")
    r.add_argument("--loss", type=float, metavar="P", help="KV link message loss probability")
    r.add_argument("--repeats", type=int, help="override the number of repeats")
    r.add_argument("--out", help="output directory (default results/<scenario>-<time>)")
    r.add_argument("--debug-invariants", action="store_true", help="check block conservation after every step")
    r.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve a Prometheus /metrics endpoint per node on 127.0.0.1 (0 = ephemeral; node i gets PORT+i)",
    )
    r.add_argument(
        "--hold-metrics", type=float, default=0.0, metavar="S", help="keep /metrics up S seconds after each run"
    )
    r.add_argument(
        "--log-stats",
        type=float,
        nargs="?",
        const=5.0,
        metavar="S",
        help="print vLLM-style stats lines per node every S seconds of the run's clock (default 5)",
    )
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("compare", help="compare results JSON files; thresholds set the exit code")
    c.add_argument("results", nargs="+")
    c.add_argument("--threshold", action="append", metavar="EXPR")
    c.add_argument("--baseline")
    c.add_argument("--metric", action="append")
    c.set_defaults(func=cmd_compare)
    v = sub.add_parser("validate", help="validate a scenario file")
    v.add_argument("scenario")
    v.set_defaults(func=cmd_validate)
    s = sub.add_parser("scenarios", help="list the built-in scenarios")
    s.set_defaults(func=cmd_scenarios)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
