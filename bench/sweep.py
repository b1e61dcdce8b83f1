"""One scenario's runs, each run and recorded (`disagg-sim run`): a run on
either runtime (`run_one`), its results JSON and files (`Sweep`), run one
after another or in worker processes (`--jobs`, bench/parallel_runs.py),
and what a run that raises becomes (`RunCrashed`). bench/runner.py puts the
runs side by side, checks thresholds and plots."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cluster.run_result import RunResult

from .errors import InputError
from .metrics import compute_metrics
from .metrics_stream import StreamedMetrics
from .parallel_runs import result_of, runs_in_workers
from .results import build_result, write_run
from .scenario import Scenario
from .v0_report import v0_run_record


def _has_v0_node(spec) -> bool:
    return any(group.engine.engine == "v0" for _, _, group in spec.node_specs())


def has_v0_node_anywhere(scenario: Scenario) -> bool:
    """A scenario with any v0 variant gets the v0 report for all variants
    (a v1 control is compared on the same record)."""
    return any(_has_v0_node(scenario.cluster(v)) for v in scenario.variant_names)


def chaos_kills(chaos, spec) -> list[dict]:
    """The kills and restarts of a chaos plan, as Ray faults (the other kinds are in-process only)."""
    from cluster.chaos import plan_faults

    names = [(role, ns.name) for role, ns, _ in spec.node_specs()]
    prefill = [n for r, n in names if r == "prefill"]
    decode = [n for r, n in names if r == "decode"]
    plan = plan_faults(chaos, prefill, decode)
    return [{f.kind: f.target, "at": f.at} for f in plan if f.kind in ("kill", "restart")]


def run_one(
    scenario: Scenario,
    variant: str,
    repeat: int,
    runtime: str,
    ray_handle=None,
    debug_invariants: bool = False,
    observer=None,
    within=None,
    streamed: StreamedMetrics | None = None,
) -> RunResult:
    """`within(finished, total, clock_s)` hears of the run's progress as
    requests finish. `streamed` (in-process only): finished records are
    folded into it and dropped, and no step is recorded (`report.stream_records`)."""
    spec = scenario.cluster(variant)
    seed = scenario.file.seed + repeat
    workload, max_concurrency = scenario.workload(variant, seed)
    faults = scenario.file.faults
    chaos = None
    if scenario.file.chaos is not None:
        # Repeat r draws its own faults, as it draws its own workload.
        chaos = scenario.file.chaos.config(repeat)
    if runtime == "inproc":
        from cluster.inproc import InProcCluster

        if within is not None:
            from .progress import FinishWatch

            observer = FinishWatch(observer, len(workload), within)
        stream = None
        if streamed is not None:
            streamed.t0 = workload[0].arrival_time if workload else 0.0
            stream = streamed.add
        cluster = InProcCluster(
            spec,
            seed=seed,
            debug_invariants=debug_invariants,
            observer=observer,
            stream=stream,
            keep_steps=stream is None,
        )
        cluster.submit(workload, max_concurrency)
        for fault in faults:
            if fault.kind == "kill":
                cluster.kill_node_at(fault.node, fault.at)
            else:
                cluster.restart_node_at(fault.node, fault.at)
        if chaos is not None:
            cluster.inject_chaos(chaos)
        return cluster.run()
    from cluster.ray.runtime import run_ray

    ray_faults = [f.model_dump(exclude_none=True) for f in faults]
    if chaos is not None:
        ray_faults += chaos_kills(chaos, spec)
    return run_ray(
        spec,
        workload,
        seed=seed,
        max_concurrency=max_concurrency,
        handle=ray_handle,
        faults=ray_faults,
        progress=(lambda d: within(d["finished"], d["total"], d["time"])) if within is not None else None,
        **(observer.run_ray_kwargs() if observer is not None else {}),
    )


class RunCrashed(RuntimeError):
    """A run raised: a bug or an environment failure, not bad input (exit 4)."""

    def __init__(self, variant: str, repeat: int, error: BaseException) -> None:
        super().__init__(f"run {variant} r{repeat} crashed: {type(error).__name__}: {error}")
        self.variant, self.repeat, self.error = variant, repeat, error
        self.out_dir: Path | None = None


def check_jobs(
    jobs: int | None, runtime: str, metrics_port: int | None, log_interval: float | None, pace, on_cluster: bool = False
) -> None:
    """Runs in worker processes (or as Ray tasks: `on_cluster`, `jobs` None
    for all the cluster's CPUs) only where nothing in this process watches
    a run as it goes."""
    if on_cluster and runtime != "inproc":
        raise InputError(
            f"--cluster/--address with runtime {runtime}: a Ray run already runs on the cluster, one run at a time; "
            "allowed: --runtime inproc (a sweep's runs as Ray tasks), or runtime ray without --cluster"
        )
    if jobs == 1 and not on_cluster:
        return
    if jobs is None and not on_cluster:
        raise InputError("--jobs: every CPU of a cluster only with --cluster; allowed: an integer >= 1")
    if jobs is not None and jobs < 1:
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
        how = "on a Ray cluster (--cluster/--address)" if on_cluster else f"--jobs {jobs}"
        raise InputError(
            f"{how} with {', '.join(watched)}: these watch a run from this process as it goes; allowed: "
            f"--jobs 1 on this machine with {', '.join(watched)}, or {how} without"
        )


@dataclass
class Sweep:
    """How a scenario's runs are run and recorded (`run_scenario`): the
    same here and in a worker process (bench/parallel_runs.py)."""

    scenario: Scenario
    runtime: str
    ray_handle: Any = None
    debug_invariants: bool = False
    observer: Any = None  # bench/observe.py's, in-process or Ray
    pace: float | None = None
    provenance: dict | None = None
    out_dir: Path | None = None
    within: Any = None  # `run_one`'s progress callback (bench/progress.py), in this process only

    def runs(
        self, keys: list[tuple[str, int]], pool: ProcessPoolExecutor | None, starting
    ) -> Iterator[tuple[str, int, RunResult, dict]]:
        """(variant, repeat, run, results JSON) for each key, in order, the
        files written: run here one after another, or in the `pool`'s worker
        processes (`--jobs`, bench/parallel_runs.py). `starting(variant,
        repeat)` is told of each in turn. A run that raises ends the sweep as
        `RunCrashed` (bad input as itself)."""
        if pool is not None:
            runs = runs_in_workers(pool, replace(self, observer=None, ray_handle=None, within=None).finished_run, keys)
            for i, run in enumerate(runs):
                starting(run.variant, run.repeat)
                yield (
                    run.variant,
                    run.repeat,
                    *self._crashing_as_run(run.variant, run.repeat, result_of, run, runs[i + 1 :]),
                )
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
            observer.begin_run(variant=variant, repeat=repeat, pace=self.pace)
        streamed = StreamedMetrics() if self.scenario.file.report.stream_records else None
        run = run_one(
            self.scenario,
            variant,
            repeat,
            self.runtime,
            self.ray_handle,
            self.debug_invariants,
            observer,
            self.within,
            streamed,
        )
        wall = time.monotonic() - t0
        if observer is not None:
            observer.sync_counters(run.node_counters)
        run, result = self.result_of_run(variant, repeat, run, wall, streamed)
        if self.out_dir is not None:
            write_run(self.out_dir, result, run.steps)
        return run, result

    def result_of_run(
        self, variant: str, repeat: int, run: RunResult, wall: float, streamed: StreamedMetrics | None = None
    ) -> tuple[RunResult, dict]:
        """A run's results JSON; a Ray run is moved to model time first (its
        wall-clock figures kept beside). `streamed`: the metrics of a run whose
        records were folded in and dropped."""
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
            slo=report.slo.targets_s() if report.slo is not None else None,
            streamed_metrics=streamed.to_dict(run.duration, report.percentiles) if streamed is not None else None,
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
        if streamed is not None:  # no step was recorded; the nodes counted them
            result["num_steps"] = run.extra.get("num_steps", 0)
        result["scenario_config"] = scenario_config(scenario, variant, runtime)
        if self.provenance is not None:
            result["provenance"] = self.provenance
        if _has_v0_node(scenario.cluster(variant)) or has_v0_node_anywhere(scenario):
            result["v0_run_record"] = v0_run_record(result, scenario.cluster(variant), run)
        return run, result


def add_request_distortion(run: RunResult, scenario: Scenario, variant: str, repeat: int) -> None:
    """Per-request wall TTFT/E2EL of a Ray run against its in-process twin
    (bench/wall_twin.py), into `extra["distortion"]["requests"]`."""
    from .wall_twin import twin_request_distortion

    dist = run.extra.get("distortion")
    if dist is not None:
        dist["requests"] = twin_request_distortion(run, scenario, variant, repeat)


def scenario_config(scenario: Scenario, variant: str, runtime: str) -> dict:
    """What a results JSON needs to re-run its scenario exactly: the resolved
    document (after --set), where it came from (relative trace paths resolve
    against it), the overrides and this variant's settings."""
    config: dict[str, Any] = {
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
