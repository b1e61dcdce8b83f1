"""A Ray run's `RunResult`: the load driver's records checked against the
sampler, and each node's end-of-run report (counters, steps, invariant
violations, step timings, CPU time) with the run's extra: placement, KV
pulls, kills and restarts, the step-time distortion."""

from __future__ import annotations

from typing import Protocol

from engine.records import WorkloadRequest
from engine.sampler import DeterministicSampler
from node.role import NodeReport

from ..distortion import StepTimingRow, step_distortion, summarize
from ..invariants import check_requests
from ..run_result import RunResult, kv_pull_summary
from ..spec import ClusterSpec
from .cluster import RayClusterHandle
from .driver import LoadDriver
from .handles import ActorInfo, ActorRef
from .observe import DriverObservation
from .placement import describe_placement
from .proxy import ProxyStats


class FinishedRun(Protocol):
    """What the result reads of a run (`RayRun`, cluster/ray/ray_run.py, which
    calls `ray_run_result` at its end)."""

    spec: ClusterSpec
    seed: int
    handle: RayClusterHandle
    nodes: dict[str, ActorRef]
    roles: dict[str, str]
    info: dict[str, ActorInfo]
    killed: dict[str, float]
    kill_times: dict[str, list[float]]
    restart_times: dict[str, list[float]]
    kv_tls_note: str
    observation: DriverObservation | None


def ray_run_result(
    run: FinishedRun,
    driver: LoadDriver,
    workload: list[WorkloadRequest],
    reports: dict[str, NodeReport | BaseException],
    quiet: dict[str, bool | BaseException],
    duration: float,
    completed: bool,
    proxy_stats: ProxyStats,
    keep_step_timings: bool,
) -> RunResult:
    spec = run.spec
    errors: list[str] = []
    sampler = DeterministicSampler(spec.sampler.seed + run.seed, spec.sampler.stop_probability)
    records = sorted(driver.records.values(), key=lambda r: (r.arrival_time, r.request_id))
    errors.extend(
        check_requests(
            records,
            sampler.token_at,
            sampler.eos_token_id,
            spec.decode.engine.max_model_len,
            [w.request_id for w in workload],
        )
    )
    for w in workload:
        if w.request_id in driver.released and w.request_id not in driver.records:
            errors.append(f"{w.request_id}: released but never reached the proxy")
    if driver.stalled:
        errors.append("the run stalled: no progress within the stall timeout")
    if driver.timed_out:
        errors.append("the run hit its timeout")
    node_counters: dict[str, dict] = {}
    steps = []
    violations: list[dict] = []
    timings: dict[str, list[StepTimingRow]] = {}
    cpu: dict[str, float] = {}
    observer_errors: list[str] = []
    for name in run.nodes:
        if name in run.killed:
            # Counters are ints on both runtimes (bench/results.py); when
            # it was killed is in `extra["killed"]`.
            node_counters[name] = {"killed": 1}
            continue
        report = reports.get(name)
        if isinstance(report, BaseException) or report is None:
            errors.append(f"{name}: no report ({type(report).__name__}: {report})")
            node_counters[name] = {}
            continue
        if quiet.get(name) is not True:
            errors.append(f"{name}: did not drain within the quiesce timeout")
        node_counters[name] = dict(report.counters)
        if name in run.restart_times:  # the fresh process's counters, since its restart
            node_counters[name]["restarts"] = len(run.restart_times[name])
        steps.extend(report.steps)
        violations.extend(report.violations)
        errors.extend(report.invariant_errors)
        timings[name] = [
            StepTimingRow(t.step_index, t.submitted, t.completed, t.modelled_s, t.run_s) for t in report.timings
        ]
        observer_errors.extend(report.observer_errors)
        cpu[name] = round(report.where["cpu_s"] - run.info.get(name, {}).get("cpu_s", 0.0), 3)
    steps.sort(key=lambda s: (s.time, s.node))
    pulls = kv_pull_summary(node_counters)
    extra = {
        "time_scale": spec.time_scale,
        "ray": run.handle.describe(),
        "placement_policy": describe_placement(run.handle.cluster_resources(), spec.placement),
        "placement": _placement(run),
        "kv_tls": run.kv_tls_note,
        "kv_addresses": {n: i.get("address") for n, i in run.info.items() if run.roles.get(n) == "prefill"},
        "kv_pulls": pulls,
        "killed": {name: times[0] for name, times in run.kill_times.items()},
        "restarted": {name: times[0] for name, times in run.restart_times.items()},
        "completed": completed,
        "cpu_s": cpu,
        **proxy_stats,
    }
    extra["distortion"] = summarize(
        {name: d for name, t in timings.items() if (d := step_distortion(t, _pp_size(run.spec, name))) is not None},
        spec.time_scale,
    )
    if keep_step_timings:
        extra["step_timings"] = timings
    if run.observation is not None:
        extra["stats_lines"] = list(run.observation.lines)
        extra["observer_errors"] = observer_errors
    return RunResult(
        clock="wall",
        duration=duration,
        requests=records,
        steps=steps,
        node_counters=node_counters,
        violations=violations,
        invariant_errors=errors,
        extra=extra,
    )


def _pp_size(spec: ClusterSpec, name: str) -> int:
    return spec.decode.pp_size if name.startswith("decode") else spec.prefill.pp_size


def _placement(run: FinishedRun) -> dict[str, str | None]:
    """Actor -> Ray node id (proxy, nodes, and each decode node's stages)."""
    out: dict[str, str | None] = {}
    for name, info in run.info.items():
        out[name] = info.get("ray_node_id")
        for i, node_id in enumerate(info.get("stage_ray_node_ids", [])):
            out[f"{name}/stage{i}"] = node_id
    return out
