"""Runs a scenario: every variant × repeat on the chosen runtime, one results
JSON (and step trace) per run, then the side-by-side comparison, thresholds
and plots."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from cluster.run_result import RunResult

from .breakdown_table import breakdown_table, format_breakdown_table
from .cluster_sweep import ClusterRuns, cluster_jobs, code_runtime_env
from .compare import format_compare_table, format_threshold_table, summarize
from .errors import InputError
from .parallel_runs import worker_pool
from .ray_checks import check_address, check_ray_run
from .scenario import Scenario
from .sweep import Sweep, check_jobs, has_v0_node_anywhere
from .thresholds import evaluate_thresholds
from .v0_report import v0_report

if TYPE_CHECKING:
    from .observe import LiveObserver, RayLiveObserver


@dataclass
class ScenarioOutcome:
    results: list[dict] = field(default_factory=list)
    runs: dict[tuple[str, int], RunResult] = field(default_factory=dict)
    threshold_outcomes: list = field(default_factory=list)
    invariant_errors: list[str] = field(default_factory=list)
    out_dir: Path | None = None
    plots: list[Path] = field(default_factory=list)
    table: tuple | None = None  # (baseline, metrics, variant -> metric -> Cell)
    breakdown: tuple | None = None  # the TTFT breakdown's table, in the same form
    report: Path | None = None
    best: tuple[str, float] | None = None  # report.best: the variant named and its mean

    @property
    def exit_code(self) -> int:
        if self.invariant_errors:
            return 3
        return 1 if any(not o.passed for o in self.threshold_outcomes) else 0


def _observer_for_run(scenario: Scenario, variants: list[str], runtime: str, metrics_port, log_interval, console):
    """One observer for the whole `run`: one /metrics endpoint per node name
    (bound once, before anything runs), series labelled with the variant."""
    if metrics_port is None and not log_interval:
        return None
    names: list[str] = []
    for v in variants:
        names += [spec.name for _, spec, _ in scenario.cluster(v).node_specs() if spec.name not in names]
    observer: LiveObserver | RayLiveObserver
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
    jobs: int | None = 1,
    breakdown: bool = False,
    by_node: bool = False,
    repeat_indices: list[int] | None = None,
    on_cluster: bool = False,
) -> ScenarioOutcome:
    """Every variant x repeat (`only`: a subset of the variants), each result
    written as it lands, then the table, thresholds, plots and report.html.
    On Ray: `ray_handle`, an open `RayClusterHandle` to run on (several
    calls can share one); by default one is launched, or attached to at
    `address`, for this call. `jobs` > 1: in-process runs go to that many
    worker processes at once (bench/parallel_runs.py), with the same results
    (they are started with `spawn`: a script that calls this with `jobs` > 1
    needs the `if __name__ == "__main__":` guard multiprocessing asks for).
    `by_node`: the table gets a column per node after each variant.
    `repeat_indices`: only these repeats (each its own seed), e.g. the one a
    result file records (`disagg-sim run RESULT.json`).
    `on_cluster`: the in-process runs go to a Ray cluster as tasks
    (`ray_handle`, or one attached to at `address` or launched; `jobs` at
    once, None for every CPU it has: bench/cluster_sweep.py), with the same
    results."""
    console = console or Console()
    runtime = runtime or scenario.file.runtime
    outcome = ScenarioOutcome()
    if out_dir is not None:
        outcome.out_dir = Path(out_dir)
    report = scenario.file.report
    variants = list(only) if only else scenario.variant_names
    repeats = list(repeat_indices) if repeat_indices is not None else list(range(scenario.file.repeats))
    total = len(variants) * len(repeats)
    if pace is not None and runtime != "inproc":
        raise InputError(
            f"--pace {pace:g}: only in-process runs have a virtual clock to pace; allowed with --runtime inproc"
        )
    check_jobs(jobs, runtime, metrics_port, log_interval, pace, on_cluster)

    observer = _observer_for_run(scenario, variants, runtime, metrics_port, log_interval, console)
    ray_ctx = None
    if (runtime == "ray" or on_cluster) and ray_handle is None:
        check_address(address)
        from cluster.ray.runtime import RayClusterHandle

        # On a cluster that may span machines, the project's code goes with the job (bench/cluster_sweep.py).
        shipped = code_runtime_env() if on_cluster or address is not None else None
        ray_ctx = RayClusterHandle(address=address, runtime_env=shipped)
    from .progress import RunProgress

    try:
        handle = ray_ctx.__enter__() if ray_ctx is not None else ray_handle
        if runtime == "ray":
            check_ray_run(scenario, variants, handle)
        clock_label = "simulated" if runtime == "inproc" else "wall"
        with RunProgress(console, f"{scenario.name} on {runtime}", total, clock_label) as progress:
            keys = [(variant, repeat) for variant in variants for repeat in repeats]
            sweep = Sweep(scenario, runtime, handle, debug_invariants, observer, pace, provenance, outcome.out_dir)
            sweep.within = progress.within
            cluster_runs = ClusterRuns(sweep, handle, cluster_jobs(handle, jobs)) if on_cluster else None
            with worker_pool(1 if on_cluster else jobs or 1) as pool:  # None: the runs go here, one after another
                runs = (
                    cluster_runs.runs(keys, progress.starting)
                    if cluster_runs
                    else sweep.runs(keys, pool, progress.starting)
                )
                for variant, repeat, run, result in runs:
                    outcome.runs[(variant, repeat)] = run
                    outcome.results.append(result)
                    progress.finished(result)
        in_order(outcome, keys)  # a cluster's runs came back as they finished
        if cluster_runs is not None:
            for line in cluster_runs.summary_lines():
                console.print(line, markup=False, highlight=False)
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
    baseline, metrics, table = summarize(outcome.results, baseline, metrics, by_node=by_node)
    outcome.table = (baseline, metrics, table)
    console.print(format_compare_table(baseline, metrics, table))
    outcome.breakdown = breakdown_table(outcome.results, baseline)
    if breakdown:
        console.print(format_breakdown_table(*outcome.breakdown))
    if runtime == "ray":
        for line in distortion_lines(outcome.results):
            console.print(line, markup=False, highlight=False)
    thresholds = [t for t in scenario.file.thresholds if not only or _names_only(t, variants)]
    outcome.threshold_outcomes = evaluate_thresholds(outcome.results, thresholds)
    if outcome.threshold_outcomes:
        console.print(format_threshold_table(outcome.threshold_outcomes))
        failed = sum(not o.passed for o in outcome.threshold_outcomes)
        console.print(f"thresholds: {len(outcome.threshold_outcomes) - failed} passed, {failed} failed")
    if report.best is not None:
        outcome.best = best_variant(outcome.results, report.best.metric, report.best.goal)
        if outcome.best is not None:
            name, value = outcome.best
            console.print(f"best variant by {report.best.metric} ({report.best.goal}): {name} ({value:.6g})")
            if outcome.out_dir is not None:
                best = {"metric": report.best.metric, "goal": report.best.goal, "variant": name, "mean": value}
                (outcome.out_dir / "best.json").write_text(json.dumps(best, indent=2) + "\n")
    if has_v0_node_anywhere(scenario):
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
        outages = outage_windows(scenario, variants)
        outcome.plots = plot_scenario(outcome.runs, variants, baseline, plot_dir, outages)
        outcome.report = write_html_report(outcome, scenario, variants, provenance, outages)
        console.print(f"results, plots and report in {outcome.out_dir} (open {outcome.report.name})")
    elif outcome.out_dir is not None:
        console.print(f"results in {outcome.out_dir}")
    return outcome


def best_variant(results: list[dict], metric: str, goal: str) -> tuple[str, float] | None:
    """The variant whose mean of `metric` over its repeats is highest (`goal`
    "max") or lowest; ties go to the variant run first. None: no result has it."""
    values: dict[str, list[float]] = {}
    for r in results:
        v = r.get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            values.setdefault(r["variant"], []).append(float(v))
    if not values:
        return None
    means = {name: sum(vs) / len(vs) for name, vs in values.items()}
    sign = 1.0 if goal == "max" else -1.0
    name = max(means, key=lambda n: sign * means[n])  # max keeps the first of equals
    return name, means[name]


def in_order(outcome: ScenarioOutcome, keys: list[tuple[str, int]]) -> None:
    """The runs, their results and invariant errors in the sweep's order
    (variant by variant, repeat by repeat), however they came back."""
    place = {key: i for i, key in enumerate(keys)}
    outcome.results.sort(key=lambda r: place[(r["variant"], r["repeat"])])
    outcome.runs = {key: outcome.runs[key] for key in keys if key in outcome.runs}
    outcome.invariant_errors = [
        f"{variant} r{repeat}: {err}" for (variant, repeat), run in outcome.runs.items() for err in run.invariant_errors
    ]


def distortion_lines(results: list[dict]) -> list[str]:
    from .wall_twin import distortion_lines as lines

    return lines(results)


def table_metrics(metrics: list[str]) -> list[str]:
    """The scenario's table rows, with the request counts always first: a
    run whose requests failed must not look fine."""
    return ["completed", "failed", *[m for m in metrics if m not in ("completed", "failed")]]


def _names_only(threshold: str, variants: list[str]) -> bool:
    from .per_node import split_variant
    from .scenario_checks import threshold_refs
    from .thresholds import parse_threshold

    return all(split_variant(ref.variant)[0] in variants for ref in threshold_refs(parse_threshold(threshold)))


def outage_windows(scenario: Scenario, variants: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Per variant, every link outage window (run seconds), for shading plots."""
    out = {}
    for v in variants:
        links = scenario.cluster(v).links
        out[v] = [w for link in (links.kv, links.proxy, links.stage) for w in link.outages]
    return out
