"""Runs a scenario: every variant × repeat on the chosen runtime, one results
JSON (and step trace) per run, then the side-by-side comparison, thresholds
and plots."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from cluster.run_result import RunResult

from .compare import evaluate_thresholds, format_compare_table, format_threshold_table, summarize
from .plots import plot_latency_cdfs, plot_step_timeseries
from .results import build_result, write_run
from .scenario import Scenario
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

    @property
    def exit_code(self) -> int:
        if self.invariant_errors:
            return 3
        return 1 if any(not o.passed for o in self.threshold_outcomes) else 0


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
    if runtime == "inproc":
        from cluster.inproc import InProcCluster

        cluster = InProcCluster(spec, seed=seed, debug_invariants=debug_invariants, observer=observer)
        cluster.submit(workload, max_concurrency)
        for fault in faults:
            cluster.kill_node_at(fault["kill"], float(fault["at"]))
        return cluster.run()
    from cluster.ray.runtime import run_ray

    return run_ray(
        spec,
        workload,
        seed=seed,
        max_concurrency=max_concurrency,
        handle=ray_handle,
        faults=faults,
        **(observer.run_ray_kwargs() if observer is not None else {}),
    )


def _observer_for(
    scenario: Scenario, variant: str, runtime: str, metrics_port, log_interval, console, hold_metrics: float = 0.0
):
    if metrics_port is None and not log_interval:
        return None
    if runtime == "ray":
        from .observe import RayLiveObserver

        # Each node actor serves its own /metrics; the URLs are printed when
        # the actors are up, and the hold happens inside the run.
        return RayLiveObserver(
            metrics_port=metrics_port, log_interval=log_interval, hold_s=hold_metrics, announce=console.print
        )
    from .observe import LiveObserver

    names = [spec.name for _, spec, _ in scenario.cluster(variant).node_specs()]
    observer = LiveObserver(names, metrics_port=metrics_port, log_interval=log_interval)
    if observer.urls:
        console.print("metrics: " + ", ".join(f"{n} {u}" for n, u in observer.urls.items()))
    return observer


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
) -> ScenarioOutcome:
    console = console or Console()
    runtime = runtime or scenario.file.runtime
    outcome = ScenarioOutcome()
    if out_dir is not None:
        outcome.out_dir = Path(out_dir)
    report = scenario.file.report
    total = len(scenario.variants) * scenario.file.repeats

    ray_ctx = None
    if runtime == "ray":
        from cluster.ray.runtime import RayClusterHandle

        ray_ctx = RayClusterHandle(address=address)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    handle = ray_ctx.__enter__() if ray_ctx is not None else None
    try:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} runs"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as bar:
            task = bar.add_task(f"{scenario.name} on {runtime}", total=total)
            for variant in scenario.variant_names:
                for repeat in range(scenario.file.repeats):
                    bar.update(task, description=f"{scenario.name}: {variant} r{repeat}")
                    t0 = time.monotonic()
                    observer = _observer_for(
                        scenario, variant, runtime, metrics_port, log_interval, console, hold_metrics
                    )
                    try:
                        run = run_one(scenario, variant, repeat, runtime, handle, debug_invariants, observer)
                        wall = time.monotonic() - t0 - (observer.held_s if observer is not None else 0.0)
                        if observer is not None:
                            observer.sync_counters(run.node_counters)
                            if hold_metrics > 0 and runtime == "inproc":  # Ray held inside run_ray
                                console.print(
                                    f"serving /metrics for {hold_metrics:g}s: " + ", ".join(observer.urls.values())
                                )
                                time.sleep(hold_metrics)
                    finally:
                        if observer is not None:
                            observer.close()
                    outcome.runs[(variant, repeat)] = run
                    for err in run.invariant_errors:
                        outcome.invariant_errors.append(f"{variant} r{repeat}: {err}")
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
                            **run.extra,
                        },
                    )
                    if _has_v0_node(scenario.cluster(variant)) or _has_v0_node_anywhere(scenario):
                        result["v0_run_record"] = v0_run_record(result, scenario.cluster(variant), run)
                    outcome.results.append(result)
                    if outcome.out_dir is not None:
                        write_run(outcome.out_dir, result, run.steps)
                    bar.advance(task)
    finally:
        if ray_ctx is not None:
            ray_ctx.__exit__(None, None, None)

    baseline, metrics, table = summarize(outcome.results, report.baseline, report.metrics)
    console.print(format_compare_table(baseline, metrics, table))
    outcome.threshold_outcomes = evaluate_thresholds(outcome.results, scenario.file.thresholds)
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
        steps = {v: outcome.runs[(v, 0)].steps for v in scenario.variant_names}
        records = {v: outcome.runs[(v, 0)].requests for v in scenario.variant_names}
        plot_dir = outcome.out_dir / "plots"
        outcome.plots = plot_step_timeseries(steps, plot_dir) + plot_latency_cdfs(records, plot_dir)
        console.print(f"results and plots in {outcome.out_dir}")
    return outcome
