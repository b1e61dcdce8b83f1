"""The Ray runtime: the same topology as the in-process cluster, as real
processes on a Ray cluster, on the wall clock.

    with RayClusterHandle() as handle:             # or RayClusterHandle(address=...)
        result = run_ray(spec, workload, handle=handle)

One run = fresh actors: a proxy (on the driver's machine), one actor per
prefill and decode node (placed by `cluster.ray.placement`), and `pp_size`
stage workers per decode node (on their node's machine). KV blocks move
between nodes over gRPC; the KV link's impairments are gRPC interceptors on
the consumer's channels, the proxy and stage links are applied in the
application. At the end every node drains, checks its own invariants
(`NodeRole.report`: `NodeCore.end_of_run_errors`) and reports; then every actor of the run
is stopped and killed.

Time: a `RunResult` from here has clock="wall"; every time in it is wall
seconds since the run started (t = 0 when the load driver starts). Step
durations are slept as `modelled_duration * spec.time_scale`, so with
`time_scale` 0.05 a run is ~20x shorter than its modelled time; link delays,
pull timeouts and deadlines, fault times and outage windows are wall seconds
and are not scaled. Step records carry the modelled (unscaled) duration.

Live observation (`cluster/ray/observe.py`): with an `observer_factory`
every node actor keeps a Prometheus exporter and formats vLLM-style stats
lines; the driver fetches both while the run goes on, logs the lines and
hands each exposition to `on_exposition` (bench serves them).

Faults: `[{"kill": "prefill-0", "at": 2.0}]` kills that node's actor at run
time 2.0 s (its process and gRPC server die with it); `{"restart":
"prefill-0", "at": 3.0}` brings it back as a fresh actor (empty pool and
cache, new ports), let in by the proxy once it has seen the old one go, and
routed to again; its counters in the results are the fresh process's, with
`restarts`. Link outages come from `spec.links.*.outages` (run seconds).
"""

from __future__ import annotations

import asyncio

from engine.records import WorkloadRequest

from ..run_result import RunResult
from ..spec import ClusterSpec
from .cluster import RayClusterHandle
from .driver import Progress
from .faults import FaultSpec, split_faults
from .observe import ExpositionSink, ObserverFactory
from .ray_run import RayRun


def run_ray(
    spec: ClusterSpec,
    workload: list[WorkloadRequest],
    seed: int = 0,
    max_concurrency: int | None = None,
    address: str | None = None,
    faults: list[FaultSpec] | None = None,
    progress: Progress | None = None,
    *,
    handle: RayClusterHandle | None = None,
    timeout_s: float | None = None,
    stall_timeout_s: float | None = None,
    kv_hold_timeout_s: float | None = None,
    quiesce_timeout_s: float = 10.0,
    keep_step_timings: bool = False,
    observer_factory: ObserverFactory | None = None,
    on_exposition: ExpositionSink | None = None,
) -> RunResult:
    """Run `workload` on a Ray cluster: `handle` (shared by several runs), or
    one launched for this run (`address=None`) or attached to (`address`).

    `stall_timeout_s` (default max(60, 3 x kv_pull_deadline_s)) ends a run in
    which nothing happened for that long; `timeout_s` bounds the whole run.
    `kv_hold_timeout_s` (default max(120, 6 x kv_pull_deadline_s)): a producer
    frees blocks no consumer reported on after that long. `keep_step_timings`
    adds every step's wall timing to `extra["step_timings"]` (for the
    overhead benchmark).

    Live observation: `observer_factory(node_name, index)` runs in each node
    actor and returns its observer (bench's `start_node_observer`);
    `on_exposition(node, text)` gets every node's /metrics text while the run
    goes on, and its final one after the node reported.
    """
    kills, restarts = split_faults(faults, spec)
    ids = [w.request_id for w in workload]
    if len(set(ids)) != len(ids):
        dup = next(r for r in ids if ids.count(r) > 1)
        raise ValueError(f"duplicate request id {dup!r} in the workload")
    if handle is None:
        with RayClusterHandle(address=address) as own:
            return run_ray(
                spec,
                workload,
                seed,
                max_concurrency,
                None,
                faults,
                progress,
                handle=own,
                timeout_s=timeout_s,
                stall_timeout_s=stall_timeout_s,
                kv_hold_timeout_s=kv_hold_timeout_s,
                quiesce_timeout_s=quiesce_timeout_s,
                keep_step_timings=keep_step_timings,
                observer_factory=observer_factory,
                on_exposition=on_exposition,
            )
    if not handle.started or handle.closed:
        raise RuntimeError("run_ray: the RayClusterHandle is not open; use it as a context manager")
    run = RayRun(handle, spec, seed, kv_hold_timeout_s, observer_factory, on_exposition)
    try:
        run.launch()
        result = asyncio.run(
            run.drive(
                workload,
                max_concurrency,
                kills,
                restarts,
                progress,
                stall_timeout_s if stall_timeout_s is not None else max(60.0, 3 * spec.kv_pull_deadline_s),
                timeout_s,
                quiesce_timeout_s,
                keep_step_timings,
            )
        )
        return result
    finally:
        run.teardown()
