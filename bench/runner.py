"""Runs a scenario: every variant × repeat on the chosen runtime, one results
JSON (and step trace) per run, then the side-by-side comparison, thresholds
and plots."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console

from cluster.run_result import RunResult

from .compare import format_compare_table, format_threshold_table, summarize
from .errors import InputError
from .metrics import compute_metrics
from .results import build_result, write_run
from .scenario import Scenario
from .thresholds import evaluate_thresholds
from .v0_report import v0_report, v0_run_record


def _has_v0_node(spec) -> bool:
    return any(group.engine.engine == "v0" for _, _, group in spec.node_specs())


def _has_v0_node_anywhere(scenario: Scenario) -> bool:
    """A scenario with any v0 variant gets the v0 report for all variants
    (a v1 control is compared on the same record)."""
    return any(_has_v0_node(scenario.cluster(v)) for v in scenario.variant_names)


@dataclass
class ScenarioOutcome:
    results: list[dict] = field(default_factory=list)
    runs: dict[tuple[str, int], RunResult] = field(default_factory=dict)
    threshold_outcomes: list = field(default_factory=list)
    invariant_errors: list[str] = field(default_factory=list)
    out_dir: Path | None = None
    plots: list[Path] = field(default_factory=list)
    table: tuple | None = None  # (baseline, metrics, variant -> metric -> Cell)
    report: Path | None = None

    @property
    def exit_code(self) -> int:
        if self.invariant_errors:
            return 3
        return 1 if any(not o.passed for o in self.threshold_outcomes) else 0


def chaos_kills(chaos, spec) -> list[dict]:
    """The kills of a chaos plan, as Ray faults (the other kinds are in-process only)."""
    from cluster.chaos import plan_faults

    names = [(role, ns.name) for role, ns, _ in spec.node_specs()]
    prefill = [n for r, n in names if r == "prefill"]
    decode = [n for r, n in names if r == "decode"]
    return [{"kill": f.target, "at": f.at} for f in plan_faults(chaos, prefill, decode) if f.kind == "kill"]


def run_one(
    scenario: Scenario,
    variant: str,
    repeat: int,
    runtime: str,
    ray_handle=None,
    debug_invariants: bool = False,
    observer=None,
) -> RunResult:
    spec = scenario.cluster(variant)
    seed = scenario.file.seed + repeat
    workload, max_concurrency = scenario.workload(variant, seed)
    faults = scenario.file.faults
    chaos = None
    if scenario.file.chaos is not None:
        from cluster.chaos import ChaosConfig

        # Repeat r draws its own faults, as it draws its own workload.
        chaos = ChaosConfig(**{**scenario.file.chaos.model_dump(), "seed": scenario.file.chaos.seed + repeat})
    if runtime == "inproc":
        from cluster.inproc import InProcCluster

        cluster = InProcCluster(spec, seed=seed, debug_invariants=debug_invariants, observer=observer)
        cluster.submit(workload, max_concurrency)
        for fault in faults:
            cluster.kill_node_at(fault.kill, fault.at)
        if chaos is not None:
            cluster.inject_chaos(chaos)
        return cluster.run()
    from cluster.ray.runtime import run_ray

    ray_faults = [f.model_dump() for f in faults]
    if chaos is not None:
        ray_faults += chaos_kills(chaos, spec)
    return run_ray(
        spec,
        workload,
        seed=seed,
        max_concurrency=max_concurrency,
        handle=ray_handle,
        faults=ray_faults,
        **(observer.run_ray_kwargs() if observer is not None else {}),
    )


def _observer_for_run(scenario: Scenario, variants: list[str], runtime: str, metrics_port, log_interval, console):
    """One observer for the whole `run`: one /metrics endpoint per node name
    (bound once, before anything runs), series labelled with the variant."""
    if metrics_port is None and not log_interval:
        return None
    names: list[str] = []
    for v in variants:
        names += [spec.name for _, spec, _ in scenario.cluster(v).node_specs() if spec.name not in names]
    try:
        if runtime == "ray":
            from .observe import RayLiveObserver

            # The driver serves every node name's /metrics for the whole run;
            # the node actors' expositions are relayed to it.
            observer = RayLiveObserver(names, metrics_port=metrics_port, log_interval=log_interval)
        else:
            from .observe import LiveObserver

            observer = LiveObserver(names, metrics_port=metrics_port, log_interval=log_interval, labels=("variant",))
    except OSError as err:
        raise InputError(
            f"--metrics-port {metrics_port}: cannot serve /metrics on 127.0.0.1 ({err.strerror or err}); "
            f"allowed: a free port (node i uses PORT+i), or 0 for ephemeral ports"
        ) from None
    if observer.urls:
        console.print("metrics: " + ", ".join(f"{n} {u}" for n, u in observer.urls.items()))
    return observer


class RunCrashed(RuntimeError):
    """A run raised: a bug or an environment failure, not bad input (exit 4)."""

    def __init__(self, variant: str, repeat: int, error: BaseException) -> None:
        super().__init__(f"run {variant} r{repeat} crashed: {type(error).__name__}: {error}")
        self.variant, self.repeat, self.error = variant, repeat, error
        self.out_dir: Path | None = None


def check_jobs(jobs: int, runtime: str, metrics_port: int | None, log_interval: float | None, pace) -> None:
    """Runs in worker processes only where nothing in this process watches a run as it goes."""
    if jobs == 1:
        return
    if jobs < 1:
        raise InputError(f"--jobs {jobs}: invalid; allowed: an integer >= 1")
    if runtime != "inproc":
        raise InputError(
            f"--jobs {jobs}: a Ray run uses the Ray cluster's processes; allowed: --jobs 1 with runtime {runtime}, "
            "or --runtime inproc"
        )
    watched = [
        flag
        for flag, on in (
            ("--metrics-port", metrics_port is not None),
            ("--log-stats", bool(log_interval)),
            ("--pace", pace is not None),
        )
        if on
    ]
    if watched:
        raise InputError(
            f"--jobs {jobs} with {', '.join(watched)}: these watch a run from this process as it goes; allowed: "
            f"--jobs 1 with {', '.join(watched)}, or --jobs {jobs} without"
        )


@dataclass
class Sweep:
    """How a scenario's runs are run and recorded (`run_scenario`): the
    same here and in a worker process (bench/parallel_runs.py)."""

    scenario: Scenario
    runtime: str
    ray_handle: object = None
    debug_invariants: bool = False
    observer: object = None
    pace: float | None = None
    provenance: dict | None = None
    out_dir: Path | None = None

    def runs(self, keys: list[tuple[str, int]], jobs: int, starting) -> Iterator[tuple[str, int, RunResult, dict]]:
        """(variant, repeat, run, results JSON) for each key, in order, the
        files written: run here one after another, or (`jobs` > 1) in worker
        processes. `starting(variant, repeat)` is told of each in turn. A
        run that raises ends the sweep as `RunCrashed` (bad input as itself)."""
        if jobs > 1 and len(keys) > 1:
            from .parallel_runs import runs_in_workers

            futures = runs_in_workers(replace(self, observer=None, ray_handle=None), keys, jobs)
            try:
                for variant, repeat, future in futures:
                    starting(variant, repeat)
                    yield variant, repeat, *self._crashing_as_run(variant, repeat, future.result)
            finally:
                futures.close()
            return
        for variant, repeat in keys:
            starting(variant, repeat)
            yield variant, repeat, *self._crashing_as_run(variant, repeat, self.finished_run, variant, repeat)

    def _crashing_as_run(self, variant: str, repeat: int, fn, *args):
        """`fn(*args)`; anything but bad input or Ctrl-C raised as `RunCrashed`
        of this run, naming the output directory (the runs before it are there)."""
        try:
            return fn(*args)
        except (InputError, KeyboardInterrupt):
            raise
        except Exception as err:
            crash = RunCrashed(variant, repeat, err)
            crash.out_dir = self.out_dir
            raise crash from err

    def finished_run(self, variant: str, repeat: int) -> tuple[RunResult, dict]:
        """One run, its results JSON, and its files written."""
        t0 = time.monotonic()
        observer = self.observer
        if observer is not None:
            observer.begin_run(variant=variant, repeat=repeat, pace=self.pace)  # type: ignore[attr-defined]
        run = run_one(self.scenario, variant, repeat, self.runtime, self.ray_handle, self.debug_invariants, observer)
        wall = time.monotonic() - t0
        if observer is not None:
            observer.sync_counters(run.node_counters)  # type: ignore[attr-defined]
        run, result = self.result_of_run(variant, repeat, run, wall)
        if self.out_dir is not None:
            write_run(self.out_dir, result, run.steps)
        return run, result

    def result_of_run(self, variant: str, repeat: int, run: RunResult, wall: float) -> tuple[RunResult, dict]:
        """A run's results JSON; a Ray run is moved to model time first (its
        wall-clock figures kept beside)."""
        scenario, runtime, report = self.scenario, self.runtime, self.scenario.file.report
        wall_run = None
        if runtime == "ray":
            from .wall_twin import to_model_time

            add_request_distortion(run, scenario, variant, repeat)
            wall_run, run = run, to_model_time(run)
        result = build_result(
            records=run.requests,
            scenario=scenario.name,
            variant=variant,
            clock=run.clock,
            repeat=repeat,
            seed=scenario.file.seed + repeat,
            steps=run.steps,
            counters_by_node=run.node_counters,
            percentiles=report.percentiles,
            duration=run.duration,
            include_requests=report.include_requests,
            extra={
                "runtime": runtime,
                "wall_seconds": wall,
                "invariant_errors": run.invariant_errors[:20],
                "violations": run.violations[:20],
                **({"pace": self.pace} if self.pace is not None else {}),
                **run.extra,
            },
        )
        if wall_run is not None:
            from .wall_twin import LATENCY_CLOCK, wall_clock_metrics

            result["latency_clock"] = LATENCY_CLOCK
            wall_metrics = compute_metrics(wall_run.requests, duration=wall_run.duration).to_dict()
            result["wall_clock"] = wall_clock_metrics(wall_metrics, wall_run.extra.get("time_scale", 1.0))
        result["scenario_config"] = scenario_config(scenario, variant, runtime)
        if self.provenance is not None:
            result["provenance"] = self.provenance
        if _has_v0_node(scenario.cluster(variant)) or _has_v0_node_anywhere(scenario):
            result["v0_run_record"] = v0_run_record(result, scenario.cluster(variant), run)
        return run, result


def run_scenario(
    scenario: Scenario,
    runtime: str | None = None,
    out_dir: str | Path | None = None,
    console: Console | None = None,
    address: str | None = None,
    debug_invariants: bool = False,
    metrics_port: int | None = None,
    log_interval: float | None = None,
    hold_metrics: float = 0.0,
    provenance: dict | None = None,
    only: list[str] | None = None,
    pace: float | None = None,
    ray_handle=None,
    jobs: int = 1,
) -> ScenarioOutcome:
    """Every variant x repeat (`only`: a subset of the variants), each result
    written as it lands, then the table, thresholds, plots and report.html.
    On Ray: `ray_handle`, an open `RayClusterHandle` to run on (several
    calls can share one); by default one is launched, or attached to at
    `address`, for this call. `jobs` > 1: in-process runs go to that many
    worker processes at once (bench/parallel_runs.py), with the same results."""
    console = console or Console()
    runtime = runtime or scenario.file.runtime
    outcome = ScenarioOutcome()
    if out_dir is not None:
        outcome.out_dir = Path(out_dir)
    report = scenario.file.report
    variants = list(only) if only else scenario.variant_names
    total = len(variants) * scenario.file.repeats
    if pace is not None and runtime != "inproc":
        raise InputError(
            f"--pace {pace:g}: only in-process runs have a virtual clock to pace; allowed with --runtime inproc"
        )
    check_jobs(jobs, runtime, metrics_port, log_interval, pace)

    observer = _observer_for_run(scenario, variants, runtime, metrics_port, log_interval, console)
    ray_ctx = None
    if runtime == "ray" and ray_handle is None:
        from cluster.ray.runtime import RayClusterHandle

        ray_ctx = RayClusterHandle(address=address)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        handle = ray_ctx.__enter__() if ray_ctx is not None else ray_handle
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} runs"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as bar:
            task = bar.add_task(f"{scenario.name} on {runtime}", total=total)
            keys = [(variant, repeat) for variant in variants for repeat in range(scenario.file.repeats)]

            def starting(variant: str, repeat: int) -> None:
                bar.update(task, description=f"{scenario.name}: {variant} r{repeat}")

            sweep = Sweep(scenario, runtime, handle, debug_invariants, observer, pace, provenance, outcome.out_dir)
            runs = sweep.runs(keys, jobs, starting)
            for variant, repeat, run, result in runs:
                outcome.runs[(variant, repeat)] = run
                for err in run.invariant_errors:
                    outcome.invariant_errors.append(f"{variant} r{repeat}: {err}")
                outcome.results.append(result)
                bar.advance(task)
        if observer is not None and hold_metrics > 0 and observer.urls:
            console.print(f"serving /metrics for {hold_metrics:g}s: " + ", ".join(observer.urls.values()))
            time.sleep(hold_metrics)
    finally:
        if observer is not None:
            observer.close()
        if ray_ctx is not None:
            ray_ctx.__exit__(None, None, None)

    metrics = table_metrics(report.metrics)
    baseline = report.baseline if report.baseline in variants else None
    baseline, metrics, table = summarize(outcome.results, baseline, metrics)
    outcome.table = (baseline, metrics, table)
    console.print(format_compare_table(baseline, metrics, table))
    if runtime == "ray":
        for line in distortion_lines(outcome.results):
            console.print(line, markup=False, highlight=False)
    thresholds = [t for t in scenario.file.thresholds if not only or _names_only(t, variants)]
    outcome.threshold_outcomes = evaluate_thresholds(outcome.results, thresholds)
    if outcome.threshold_outcomes:
        console.print(format_threshold_table(outcome.threshold_outcomes))
        failed = sum(not o.passed for o in outcome.threshold_outcomes)
        console.print(f"thresholds: {len(outcome.threshold_outcomes) - failed} passed, {failed} failed")
    if _has_v0_node_anywhere(scenario):
        renderable, v0_data = v0_report(outcome.results, outcome.runs, scenario)
        if renderable is not None:
            console.print(renderable)
            if outcome.out_dir is not None:
                (outcome.out_dir / "v0_report.json").write_text(json.dumps(v0_data, indent=2) + "\n")
    if outcome.invariant_errors:
        console.print(f"[red]{len(outcome.invariant_errors)} invariant error(s):[/]")
        for err in outcome.invariant_errors[:20]:
            console.print(f"  {err}", markup=False)
    if report.plots and outcome.out_dir is not None:
        from .html_report import write_html_report
        from .plots import plot_scenario  # matplotlib: imported only to plot (not by a sweep's worker processes)

        plot_dir = outcome.out_dir / "plots"
        outcome.plots = plot_scenario(outcome.runs, variants, baseline, plot_dir, outage_windows(scenario, variants))
        outcome.report = write_html_report(outcome, scenario, variants, provenance)
        console.print(f"results, plots and report in {outcome.out_dir} (open {outcome.report.name})")
    elif outcome.out_dir is not None:
        console.print(f"results in {outcome.out_dir}")
    return outcome


def add_request_distortion(run: RunResult, scenario: Scenario, variant: str, repeat: int) -> None:
    """Per-request wall TTFT/E2EL of a Ray run against its in-process twin
    (bench/wall_twin.py), into `extra["distortion"]["requests"]`."""
    from .wall_twin import twin_request_distortion

    dist = run.extra.get("distortion")
    if dist is not None:
        dist["requests"] = twin_request_distortion(run, scenario, variant, repeat)


def distortion_lines(results: list[dict]) -> list[str]:
    from .wall_twin import distortion_lines as lines

    return lines(results)


def table_metrics(metrics: list[str]) -> list[str]:
    """The scenario's table rows, with the request counts always first: a
    run whose requests failed must not look fine."""
    return ["completed", "failed", *[m for m in metrics if m not in ("completed", "failed")]]


def _names_only(threshold: str, variants: list[str]) -> bool:
    from .scenario import _refs
    from .thresholds import parse_threshold

    return all(ref.variant in variants for ref in _refs(parse_threshold(threshold)))


def scenario_config(scenario: Scenario, variant: str, runtime: str) -> dict:
    """What a results JSON needs to re-run its scenario exactly: the resolved
    document (after --set), where it came from (relative trace paths resolve
    against it), the overrides and this variant's settings."""
    config = {
        "source": str(Path(scenario.source).resolve()),
        "document": scenario.raw,
        "overrides": scenario.overrides,
        "variant_set": scenario.variant(variant).set,
        "runtime": runtime,
        "resolved_cluster": scenario.cluster(variant).model_dump(mode="json"),
    }
    if scenario.file.trace is not None:
        config["trace_sha256"] = file_sha256(scenario.trace_path())
    return config


def file_sha256(path: Path) -> str | None:
    import hashlib

    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def outage_windows(scenario: Scenario, variants: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Per variant, every link outage window (run seconds), for shading plots."""
    out = {}
    for v in variants:
        links = scenario.cluster(v).links
        out[v] = [w for link in (links.kv, links.proxy, links.stage) for w in link.outages]
    return out
