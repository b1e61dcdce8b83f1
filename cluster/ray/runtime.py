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
import logging
import time

from cluster.ray.env import ray
from cluster.wall.auth import derive_key, new_run_secret
from cluster.wall.clock import RunClock
from cluster.wall.node_host import WallNodeSettings
from cluster.wall.tls import kv_tls_for_run
from engine.node_core import NodeSpec
from engine.records import WorkloadRequest
from engine.sampler import DeterministicSampler
from node.role import NodeReport

from ..distortion import StepTimingRow, step_distortion, summarize
from ..invariants import check_requests
from ..run_result import RunResult, kv_pull_summary
from ..spec import ClusterSpec
from .actors import DecodeNodeActor, PrefillNodeActor
from .auth import require_ray_auth
from .cluster import RayClusterHandle
from .driver import LoadDriver, Progress
from .faults import FaultSpec, split_faults
from .handles import ActorInfo, ActorRef, spawn
from .observe import DriverObservation, ExpositionSink, ObserverFactory
from .placement import describe_placement, node_actor_options, pinned_options
from .proxy import ProxyActor, ProxyStats

logger = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0  # actor start-up and control calls (not the run itself)
START_LEAD_S = 0.25  # t = 0 lies this far after the actors are told, so all start together


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
    run = _RayRun(handle, spec, seed, kv_hold_timeout_s, observer_factory, on_exposition)
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


class _RayRun:
    def __init__(
        self,
        handle: RayClusterHandle,
        spec: ClusterSpec,
        seed: int,
        kv_hold_timeout_s: float | None,
        observer_factory: ObserverFactory | None = None,
        on_exposition: ExpositionSink | None = None,
    ) -> None:
        self.handle = handle
        self.observer_factory = observer_factory
        self.on_exposition = on_exposition
        self.observation: DriverObservation | None = None
        self.spec = spec
        self.seed = seed
        self.name = handle.next_run_name()
        if kv_hold_timeout_s is not None:
            self.spec = spec = spec.model_copy(update={"kv_hold_timeout_s": kv_hold_timeout_s})
        self.nodes: dict[str, ActorRef] = {}
        self.roles: dict[str, str] = {}
        self.info: dict[str, ActorInfo] = {}
        self.proxy: ActorRef | None = None
        self.killed: dict[str, float] = {}  # nodes dead now -> when
        self.kill_times: dict[str, list[float]] = {}
        self.restart_times: dict[str, list[float]] = {}
        self.replaced: list[ActorRef] = []  # killed actors a restart replaced
        self._plans: dict[str, tuple[int, str, NodeSpec]] = {}
        self.start_wall = 0.0
        self.proxy_address: tuple[str, int] = ("", 0)
        # One secret per run, handed to every actor in its constructor
        # arguments (Ray's own channels; never logged): docs/security.md.
        self.secret = new_run_secret()
        # TLS on the KV handoff: on by default when attached to a cluster (cluster/wall/tls.py).
        self.kv_tls, self.kv_tls_note = kv_tls_for_run(spec.tls, attached=not handle.launched)
        if not handle.launched:
            require_ray_auth()

    def _settings(self, index: int, name: str) -> WallNodeSettings:
        s = self.spec
        return WallNodeSettings(
            # The node's KV tickets are keyed from the run's secret (docs/security.md).
            node=s.node_settings(time_scale=s.time_scale, ticket_key=derive_key(self.secret, f"tickets/{name}")),
            stage_link=s.links.stage.to_spec(),
            kv_link=s.links.kv.to_spec(),
            link_seed=self.seed * 1000 + index + 1,
            secret=self.secret,
            kv_tls=self.kv_tls,
        )

    def _spawn_node(self, index: int, role: str, node_spec: NodeSpec, suffix: str = "") -> ActorRef:
        actor_name = f"{self.name}-{node_spec.name}{suffix}"
        placed = node_actor_options(
            role, self.handle.cluster_resources(), self.spec.placement, self.handle.driver_node_id
        )
        options = {"name": actor_name, **placed}
        settings = self._settings(index, node_spec.name)
        if role == "prefill":
            actor = spawn(PrefillNodeActor, options, node_spec, settings, self.observer_factory, index)
        else:
            actor = spawn(DecodeNodeActor, options, node_spec, settings, actor_name, self.observer_factory, index)
        self.handle.track(actor)
        return actor

    def launch(self) -> None:
        for index, (role, node_spec, _) in enumerate(self.spec.node_specs(self.seed)):
            self._plans[node_spec.name] = (index, role, node_spec)
            self.nodes[node_spec.name] = self._spawn_node(index, role, node_spec)
            self.roles[node_spec.name] = role
        proxy = self.proxy = spawn(
            ProxyActor, {"name": f"{self.name}-proxy", **pinned_options(self.handle.driver_node_id)}
        )
        self.handle.track(proxy)
        # Every process up and imported before the run's clock starts.
        infos: list[ActorInfo] = ray.get(
            [a.start.remote() for a in self.nodes.values()] + [proxy.ready.remote()], timeout=CALL_TIMEOUT_S
        )
        self.info = {info["name"]: info for info in infos}

    def proxy_actor(self) -> ActorRef:
        if self.proxy is None:
            raise RuntimeError(f"run {self.name}: not launched")
        return self.proxy

    async def drive(
        self,
        workload: list[WorkloadRequest],
        max_concurrency: int | None,
        kills: list[tuple[str, float]],
        restarts: list[tuple[str, float]],
        progress: Progress | None,
        stall_timeout_s: float,
        timeout_s: float | None,
        quiesce_timeout_s: float,
        keep_step_timings: bool,
    ) -> RunResult:
        start_wall = time.time() + START_LEAD_S
        by_role = {r: {n: a for n, a in self.nodes.items() if self.roles[n] == r} for r in ("prefill", "decode")}
        proxy = self.proxy_actor()
        proxy_address = await asyncio.wait_for(
            proxy.begin.remote(
                self.spec.model_dump_json(),
                self.seed,
                start_wall,
                by_role["prefill"],
                by_role["decode"],
                self.secret,
                self.kv_tls,
            ),
            CALL_TIMEOUT_S,
        )
        await asyncio.wait_for(
            asyncio.gather(*(actor.begin.remote(start_wall, proxy_address) for actor in self.nodes.values())),
            CALL_TIMEOUT_S,
        )
        clock = RunClock.from_wall_start(start_wall)
        obs = self.observation = (
            DriverObservation(self.nodes, clock, self.on_exposition) if self.observer_factory is not None else None
        )
        driver = LoadDriver(
            proxy.submit.remote,
            workload,
            clock,
            max_concurrency,
            progress,
            on_finished=obs.on_finished if obs is not None else None,
        )
        stream = proxy.stream.options(num_returns="streaming").remote()
        consumer = asyncio.ensure_future(driver.consume(stream))
        tasks = [asyncio.ensure_future(driver.release_all())]
        if obs is not None:
            tasks.append(asyncio.ensure_future(obs.poll()))
        self.start_wall, self.proxy_address = start_wall, proxy_address
        tasks += [asyncio.ensure_future(self._kill_at(clock, name, at)) for name, at in kills]
        restarting = [(at, asyncio.ensure_future(self._restart_at(clock, name, at))) for name, at in restarts]
        completed = await driver.wait_done(stall_timeout_s, timeout_s)
        # The run lasted until its last request finished (the driver hears of
        # it a little later: client events come in batches).
        ends = [r.finish_time for r in driver.records.values() if r.finish_time is not None]
        duration = max(ends) if completed and ends else clock.now()
        # A restart already due finishes (its node then drains and reports); later ones are not made.
        due = [task for at, task in restarting if at <= clock.now()]
        if due:
            await asyncio.wait(due, timeout=CALL_TIMEOUT_S)
        for task in tasks + [task for _, task in restarting]:
            task.cancel()
        proxy_stats: ProxyStats = await asyncio.wait_for(proxy.close_stream.remote(), CALL_TIMEOUT_S)
        try:
            await asyncio.wait_for(consumer, 5.0)
        except (TimeoutError, Exception):
            consumer.cancel()
        live = {n: a for n, a in self.nodes.items() if n not in self.killed}
        quiet = await asyncio.wait_for(
            asyncio.gather(*(a.quiesce.remote(quiesce_timeout_s) for a in live.values()), return_exceptions=True),
            quiesce_timeout_s + CALL_TIMEOUT_S,
        )
        if obs is not None:
            await obs.flush(CALL_TIMEOUT_S)  # every finished request is in its node's histograms
        reports = await asyncio.wait_for(
            asyncio.gather(*(a.report.remote() for a in live.values()), return_exceptions=True), CALL_TIMEOUT_S
        )
        if obs is not None:
            await obs.fetch(CALL_TIMEOUT_S)  # the last lines, and the counters just reported
        return self._result(
            driver,
            workload,
            dict(zip(live, reports)),
            dict(zip(live, quiet)),
            duration,
            completed,
            proxy_stats,
            keep_step_timings,
        )

    async def _kill_at(self, clock: RunClock, name: str, at: float) -> None:
        await clock.sleep_until(at)
        logger.warning("fault: killing %s at t=%.3f s", name, clock.now())
        self.killed[name] = clock.now()
        self.kill_times.setdefault(name, []).append(clock.now())
        if self.observation is not None:
            self.observation.forget(name)
        ray.kill(self.nodes[name], no_restart=True)

    async def _restart_at(self, clock: RunClock, name: str, at: float) -> None:
        """A killed node comes back as a fresh process (empty pool and cache,
        new ports): started, let in by the proxy, begun on the run's clock."""
        await clock.sleep_until(at)
        while name not in self.killed:  # its kill is due first (split_faults), maybe not done yet
            await asyncio.sleep(0.01)
        logger.warning("fault: restarting %s at t=%.3f s", name, clock.now())
        index, role, node_spec = self._plans[name]
        n = len(self.restart_times.get(name, [])) + 1
        actor = self._spawn_node(index, role, node_spec, suffix=f"-r{n}")
        self.replaced.append(self.nodes[name])
        self.nodes[name] = actor
        info: ActorInfo = await asyncio.wait_for(actor.start.remote(), CALL_TIMEOUT_S)
        self.info[name] = info
        # The proxy lets the fresh process in once it has seen the old one go
        # (its connection closed, its requests failed or re-routed).
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while not await asyncio.wait_for(self.proxy_actor().node_restarting.remote(name, actor), CALL_TIMEOUT_S):
            if time.monotonic() > deadline:
                raise TimeoutError(f"restart of {name}: the proxy never saw the killed process go")
            await asyncio.sleep(0.05)
        await asyncio.wait_for(actor.begin.remote(self.start_wall, self.proxy_address), CALL_TIMEOUT_S)
        del self.killed[name]
        self.restart_times.setdefault(name, []).append(clock.now())

    def _result(
        self,
        driver: LoadDriver,
        workload: list[WorkloadRequest],
        reports: dict[str, NodeReport | BaseException],
        quiet: dict[str, bool | BaseException],
        duration: float,
        completed: bool,
        proxy_stats: ProxyStats,
        keep_step_timings: bool,
    ) -> RunResult:
        spec = self.spec
        errors: list[str] = []
        sampler = DeterministicSampler(spec.sampler.seed + self.seed, spec.sampler.stop_probability)
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
        for name in self.nodes:
            if name in self.killed:
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
            if name in self.restart_times:  # the fresh process's counters, since its restart
                node_counters[name]["restarts"] = len(self.restart_times[name])
            steps.extend(report.steps)
            violations.extend(report.violations)
            errors.extend(report.invariant_errors)
            timings[name] = [
                StepTimingRow(t.step_index, t.submitted, t.completed, t.modelled_s, t.run_s) for t in report.timings
            ]
            observer_errors.extend(report.observer_errors)
            cpu[name] = round(report.where["cpu_s"] - self.info.get(name, {}).get("cpu_s", 0.0), 3)
        steps.sort(key=lambda s: (s.time, s.node))
        pulls = kv_pull_summary(node_counters)
        extra = {
            "time_scale": spec.time_scale,
            "ray": self.handle.describe(),
            "placement_policy": describe_placement(self.handle.cluster_resources(), spec.placement),
            "placement": self._placement(),
            "kv_tls": self.kv_tls_note,
            "kv_addresses": {n: i.get("address") for n, i in self.info.items() if self.roles.get(n) == "prefill"},
            "kv_pulls": pulls,
            "killed": {name: times[0] for name, times in self.kill_times.items()},
            "restarted": {name: times[0] for name, times in self.restart_times.items()},
            "completed": completed,
            "cpu_s": cpu,
            **proxy_stats,
        }
        extra["distortion"] = summarize(
            {name: d for name, t in timings.items() if (d := step_distortion(t, self._pp_size(name))) is not None},
            spec.time_scale,
        )
        if keep_step_timings:
            extra["step_timings"] = timings
        if self.observation is not None:
            extra["stats_lines"] = list(self.observation.lines)
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

    def _pp_size(self, name: str) -> int:
        return self.spec.decode.pp_size if name.startswith("decode") else self.spec.prefill.pp_size

    def _placement(self) -> dict[str, str | None]:
        """Actor -> Ray node id (proxy, nodes, and each decode node's stages)."""
        out: dict[str, str | None] = {}
        for name, info in self.info.items():
            out[name] = info.get("ray_node_id")
            for i, node_id in enumerate(info.get("stage_ray_node_ids", [])):
                out[f"{name}/stage{i}"] = node_id
        return out

    def teardown(self) -> None:
        """Stop every actor of the run (gracefully, then for certain)."""
        actors = [a for n, a in self.nodes.items() if n not in self.killed]
        try:
            ray.get([a.stop.remote() for a in actors], timeout=10.0)
        except Exception as err:  # a dead or stuck actor: it is killed below
            logger.warning("run %s: graceful stop incomplete: %s", self.name, type(err).__name__)
        for actor in list(self.nodes.values()) + self.replaced + ([self.proxy] if self.proxy is not None else []):
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
            self.handle.untrack(actor)
