"""One Ray run's actors: a proxy pinned to the driver's machine, a node actor
per prefill and decode node (placed by `cluster.ray.placement`), started
together, driven by the load driver (`drive`), killed and restarted by the
run's faults, and stopped at the end (`teardown`). `run_ray` (`runtime.py`)
replays a workload on one; `RayServing` (`serving.py`) serves on one."""

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

from ..run_result import RunResult
from ..spec import ClusterSpec
from .actors import DecodeNodeActor, PrefillNodeActor
from .auth import require_ray_auth
from .cluster import RayClusterHandle
from .driver import LoadDriver, Progress
from .handles import ActorInfo, ActorRef, spawn
from .observe import DriverObservation, ExpositionSink, ObserverFactory
from .placement import node_actor_options, pinned_options
from .proxy import ProxyActor, ProxyStats
from .run_report import ray_run_result

logger = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0  # actor start-up and control calls (not the run itself)
START_LEAD_S = 0.25  # t = 0 lies this far after the actors are told, so all start together


class RayRun:
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
        return ray_run_result(
            self,
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
