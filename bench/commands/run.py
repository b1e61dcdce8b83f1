"""`disagg-sim run`: run a scenario's variants × repeats and print the table."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .parsing import BY_NODE_HELP, console, number
from .run_inputs import link_overrides, load_for_run, parse_set, prepare_out_dir

DEFAULT_SCENARIO = "cascade"
# The results directory of the command being run, once there is one (`main`'s crash report).
RUN_DIR: dict[str, Path] = {}


def add_parser(sub) -> None:
    r = sub.add_parser("run", help="run a scenario (default: the built-in cross-process cascade)")
    r.add_argument(
        "scenario",
        nargs="?",
        default=DEFAULT_SCENARIO,
        help="a scenario file, a built-in name, or a results JSON (re-runs that run exactly: its variant and repeat; "
        "with --only or --repeats, its scenario's variants and repeats)",
    )
    r.add_argument("--runtime", choices=["inproc", "ray"], help="override the scenario's runtime")
    r.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a setting, e.g. cluster.decode.engine.num_gpu_blocks=256 (refused if a variant sets it too)",
    )
    r.add_argument("--only", action="append", metavar="VARIANT", help="run only this variant (repeatable)")
    r.add_argument(
        "--address",
        help="attach to an existing Ray cluster (default: launch a local one on 127.0.0.1); an in-process "
        "scenario's runs go there as Ray tasks (--jobs at once)",
    )
    r.add_argument("--net-delay", type=number("float", 0), metavar="MS", help="KV link one-way delay")
    r.add_argument("--jitter", type=number("float", 0), metavar="MS", help="KV link delay jitter")
    r.add_argument("--bandwidth", type=number("float", 0, lo_open=True), metavar="MBPS", help="KV link cap, MB/s")
    r.add_argument("--loss", type=number("float", 0, 0.999999), metavar="P", help="KV link message loss probability")
    r.add_argument("--repeats", type=number("int", 1, 1000), help="override the number of repeats")
    r.add_argument(
        "--jobs",
        type=number("int", 1, 64),
        default=1,
        metavar="N",
        help="in-process only: run up to N of the variant x repeat runs at once, in worker processes, or as Ray "
        "tasks with --address (same results; default 1)",
    )
    r.add_argument(
        "--cluster",
        action="store_true",
        help="in-process runs as Ray tasks on the cluster at --address (or a local one), as many at once as it has "
        "CPUs (same results; docs/scale.md)",
    )
    r.add_argument(
        "--breakdown",
        action="store_true",
        help="also print the TTFT breakdown: mean ms per part of the first token's path (docs/cost-model.md)",
    )
    r.add_argument("--by-node", action="store_true", help=BY_NODE_HELP)
    r.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="refuse a run estimated above SIZE (e.g. 4G, 512M), warn above half of it "
        "(default: this machine's memory; 'off' skips the check; docs/usage.md)",
    )
    r.add_argument("--out", help="output directory (default: a new results/<scenario>-<time>)")
    r.add_argument("--overwrite", action="store_true", help="let --out name a directory that holds a previous run")
    r.add_argument("--debug-invariants", action="store_true", help="check block conservation after every step")
    r.add_argument(
        "--pace",
        type=number("float", 0, 1e6, lo_open=True),
        metavar="X",
        help="in-process only: hold the virtual clock to X times real time (1 = real time), for dashboards",
    )
    r.add_argument(
        "--metrics-port",
        type=number("int", 0, 65535),
        metavar="PORT",
        help="serve a Prometheus /metrics endpoint per node on 127.0.0.1 for the whole run, series labelled "
        "with the variant (0 = ephemeral; node i gets PORT+i)",
    )
    r.add_argument(
        "--hold-metrics",
        type=number("float", 0, 86400),
        default=0.0,
        metavar="S",
        help="keep /metrics up S seconds after the runs",
    )
    r.add_argument(
        "--log-stats",
        type=number("float", 0, 86400, lo_open=True),
        nargs="?",
        const=5.0,
        metavar="S",
        help="print vLLM-style stats lines per node every S seconds of the run's clock (default 5)",
    )
    r.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    from .. import provenance
    from ..runner import run_scenario
    from ..sweep import check_jobs

    out_console = console()
    scenario, result_run = load_for_run(args.scenario)
    only, repeat_indices = args.only, None
    if result_run is not None and not only and args.repeats is None:
        only, repeat_indices = [result_run[0]], [result_run[1]]
        out_console.print(
            f"re-running {result_run[0]} r{result_run[1]} from {args.scenario} (--only or --repeats: its scenario's "
            "runs)",
            markup=False,
            highlight=False,
        )
    overrides = parse_set(args.set or [])
    origins = {k: f"--set {k}" for k in overrides}
    links, link_origins = link_overrides(args)
    overrides.update(links)
    origins.update(link_origins)
    if args.repeats is not None:
        overrides["repeats"] = args.repeats
        origins["repeats"] = f"--repeats {args.repeats}"
    if overrides:
        scenario = scenario.with_overrides(overrides, origins)
    for name in only or []:
        if name not in scenario.variant_names:
            from ..errors import did_you_mean

            raise InputError(
                f"--only {name}: not a variant of {scenario.name}{did_you_mean(name, scenario.variant_names)}; "
                f"allowed: {', '.join(scenario.variant_names)}"
            )
    runtime = args.runtime or scenario.file.runtime
    if args.pace is not None and runtime != "inproc":
        raise InputError(
            f"--pace {args.pace:g}: only in-process runs have a virtual clock to pace; allowed: runtime inproc"
        )
    from ..cluster_sweep import cluster_mode

    on_cluster, jobs = cluster_mode(args, runtime)
    if runtime != "inproc" and scenario.file.report.stream_records:
        raise InputError(
            "report.stream_records: a Ray run keeps its records in the driver; allowed: runtime inproc "
            "(or stream_records false)"
        )
    check_jobs(jobs, runtime, args.metrics_port, args.log_stats, args.pace, on_cluster)
    from ..memory_estimate import check_run_memory

    check_run_memory(
        args.max_memory, scenario, only, jobs or 1, lambda line: out_console.print(line, markup=False, highlight=False)
    )
    out = prepare_out_dir(args.out, scenario.name, args.overwrite)
    RUN_DIR["out"] = out  # a crash after this point leaves its traceback beside the results
    variants = only or scenario.variant_names
    out_console.print(
        f"[bold]{scenario.name}[/]: {len(variants)} variant(s) × "
        f"{len(repeat_indices) if repeat_indices else scenario.file.repeats} repeat(s) "
        f"on {runtime}"
        + (f" ({args.address})" if args.address else "")
        + (f", {args.jobs} at once" if args.jobs > 1 else "")
        + (" as Ray tasks" if on_cluster else ""),
        highlight=False,
    )
    if scenario.file.description:
        out_console.print(scenario.file.description.strip(), markup=False)
    if runtime == "inproc":
        scales = sorted({scenario.cluster(v).time_scale for v in variants} - {1.0})
        if scales:
            out_console.print(
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
        console=out_console,
        address=args.address,
        debug_invariants=args.debug_invariants,
        metrics_port=args.metrics_port,
        log_interval=args.log_stats,
        hold_metrics=args.hold_metrics,
        provenance=provenance.collect(),
        only=only,
        pace=args.pace,
        jobs=jobs,
        on_cluster=on_cluster,
        breakdown=args.breakdown,
        by_node=args.by_node,
        repeat_indices=repeat_indices,
    )
    clock = outcome.results[0]["clock"] if outcome.results else "?"
    described = {
        "virtual": "virtual, deterministic",
        "wall": "wall, steps slept at time_scale x modelled; latencies and throughputs in model time"
        " = wall / time_scale",
    }
    out_console.print(f"clock: {clock} ({described.get(clock, clock)})")
    return outcome.exit_code
