"""Ray actor shells: each wraps a plain class and only forwards. All are
async actors, so a node's engine loop, its gRPC server or transport and the
calls from the proxy share one event loop and never race.

    PrefillNodeActor  -> WallNodeHost("prefill") -> prefill_node.PrefillNode
    DecodeNodeActor   -> WallNodeHost("decode")  -> decode_node.DecodeNode;
                         the actor starts the node's stage workers
    StageWorkerActor  -> cluster.wall.stage_worker.StageWorker

The node classes are the ones the in-process runtime runs. The end-of-run
report (`NodeRole.report`) is built inside the actor, from the node's own
core, so the Ray runtime checks exactly what the in-process runtime checks.
With an `observer_factory` (`cluster/ray/observe.py`) a node actor also
keeps a Prometheus exporter and its stats lines, which the driver fetches.
"""

from __future__ import annotations

import asyncio
import os
import time

from cluster.ray.env import ray
from cluster.wall.node_host import WallNodeHost, WallNodeSettings
from cluster.wall.stage_worker import StageStreamExecutor, StageWorker
from connector.grpc.security import KVSecurity
from connector.link import LinkSpec
from engine.node_core import NodeSpec
from engine.records import RequestRecord, StepRecord
from node.role import NodeReport

from .handles import ActorInfo, ActorRef, spawn
from .observe import ActorObservation, ObserverFactory
from .placement import colocated_options, current_node_id


def _where() -> ActorInfo:
    return {"ray_node_id": current_node_id(), "pid": os.getpid(), "cpu_s": time.process_time()}


class _NodeShell:
    """What both node actors share: begin, quiesce, report, stop."""

    host: WallNodeHost

    def _init_shell(self, observer_factory: ObserverFactory | None, index: int) -> None:
        self._stopped = asyncio.Event()
        self._observer_factory = observer_factory
        self._index = index
        self.observation: ActorObservation | None = None

    def _on_step(self, step: StepRecord) -> None:
        if self.observation is not None:
            self.observation.on_step(step)

    def _start_observation(self) -> None:
        """The node's exporter and stats logger, fed from its own steps."""
        if self._observer_factory is not None:
            self.observation = ActorObservation(self._observer_factory, self._index, self.host.node)
            self.observation.start()

    async def begin(self, start_wall: float, proxy_address: tuple[str, int]) -> None:
        await self.host.begin(start_wall, (proxy_address[0], int(proxy_address[1])))
        if self.observation is not None:
            self.observation.begin()

    async def observe_requests(self, records: list[RequestRecord]) -> None:
        """Finished requests this node served, for its latency histograms."""
        if self.observation is not None:
            self.observation.observe_requests(records)

    async def take_observation(self) -> tuple[list[tuple[int, str]], bytes | None]:
        """Stats lines since the last call and the /metrics text now, for the driver."""
        return self.observation.take() if self.observation is not None else ([], None)

    async def quiesce(self, timeout_s: float) -> bool:
        return await self.host.quiesce(timeout_s)

    async def report(self) -> NodeReport:
        report = self.host.report()
        report.where = dict(_where())
        if self.observation is not None:
            self.observation.refresh()  # the exposition shows the counters just reported
            report.observer_errors = list(self.observation.errors)
        return report

    async def exposition_now(self) -> bytes | None:
        """The /metrics text with this instant's gauges and counters (a serving
        front door's scrape; `take_observation` shows them as of the last refresh)."""
        if self.observation is None:
            return None
        self.observation.refresh()
        return self.observation.take()[1]

    async def engine_state(self) -> dict:
        """While serving: the requests its scheduler knows, what an idle node
        must not hold (`NodeCore.end_of_run_errors`) and its counters."""
        node = self.host.node
        return {
            "requests": len(node.core.request_ids()),
            "errors": node.core.end_of_run_errors(),
            "counters": node.counters(),
        }

    async def trim_history(self, keep_steps: int) -> None:
        """While serving: old step records and what finished requests left go
        (`NodeCore.trim_history`), so a long-lived node's memory is flat."""
        self.host.node.core.trim_history(keep_steps)

    async def wait_stopped(self) -> None:
        """Never returns while the node lives: the proxy's liveness watch."""
        await self._stopped.wait()

    async def _close_observation(self) -> None:
        if self.observation is not None:
            self.observation.close()

    async def stop(self) -> None:
        await self._close_observation()
        await self.host.close()
        self._stopped.set()


@ray.remote(num_cpus=0)
class PrefillNodeActor(_NodeShell):
    def __init__(
        self,
        spec: NodeSpec,
        settings: WallNodeSettings,
        observer_factory: ObserverFactory | None = None,
        index: int = 0,
    ) -> None:
        self._init_shell(observer_factory, index)
        self.host = WallNodeHost(
            "prefill", spec, settings, on_step=self._on_step, kv_host=ray.util.get_node_ip_address()
        )

    async def start(self) -> ActorInfo:
        address = await self.host.start()
        self._start_observation()
        return {"name": self.host.name, "address": address, **_where()}


@ray.remote(num_cpus=0)
class StageWorkerActor:
    def __init__(
        self,
        index: int,
        pp_size: int,
        sampler_seed: int,
        stop_probability: float,
        link_to_next: LinkSpec,
        link_seed: int,
        secret: bytes | None = None,
        tls: KVSecurity | None = None,
    ) -> None:
        self.worker = StageWorker(
            index,
            pp_size,
            sampler_seed,
            stop_probability,
            link_to_next,
            link_seed,
            host=ray.util.get_node_ip_address(),
            secret=secret,
            tls=tls,
        )

    async def ready(self) -> ActorInfo:
        return _where()

    async def serve(self) -> tuple[str, int]:
        return await self.worker.serve()

    async def connect_next(self, address: tuple[str, int]) -> None:
        await self.worker.connect_next(*address)

    async def begin(self, start_wall: float) -> ActorInfo:
        self.worker.begin(start_wall)
        return _where()

    async def stop(self) -> None:
        await self.worker.close()


@ray.remote(num_cpus=0)
class DecodeNodeActor(_NodeShell):
    """Its pipeline stages are actors of their own, on the same machine,
    started and chained by this actor; the node's steps travel through them."""

    def __init__(
        self,
        spec: NodeSpec,
        settings: WallNodeSettings,
        stage_name_prefix: str = "",
        observer_factory: ObserverFactory | None = None,
        index: int = 0,
    ) -> None:
        self._init_shell(observer_factory, index)
        self.spec = spec
        self.settings = settings
        self.stage_name_prefix = stage_name_prefix
        self.stages: list[ActorRef] = []
        self.stage_addresses: list[tuple[str, int]] = []
        self.runner = StageStreamExecutor(
            pp_size=spec.pipeline_parallel_size, secret=settings.secret, tls=settings.kv_tls
        )
        self.host = WallNodeHost("decode", spec, settings, runner=self.runner, on_step=self._on_step)

    async def start(self) -> ActorInfo:
        """Start the pipeline stages on this machine and chain them."""
        pp = self.spec.pipeline_parallel_size
        s = self.settings
        placement = colocated_options(current_node_id())
        for index in range(pp):
            options: dict[str, object] = dict(placement)
            if self.stage_name_prefix:
                options["name"] = f"{self.stage_name_prefix}-stage{index}"
            self.stages.append(
                spawn(
                    StageWorkerActor,
                    options,
                    index,
                    pp,
                    self.spec.sampler_seed,
                    self.spec.stop_probability,
                    s.stage_link,
                    s.link_seed * 100 + index,
                    s.secret,
                    s.kv_tls,
                )
            )
        self.stage_addresses = [tuple(a) for a in await asyncio.gather(*(st.serve.remote() for st in self.stages))]
        await asyncio.gather(*(self.stages[i].connect_next.remote(self.stage_addresses[i + 1]) for i in range(pp - 1)))
        stage_where = await asyncio.gather(*(st.ready.remote() for st in self.stages))
        self.runner.set_addresses(self.stage_addresses[0], self.stage_addresses[-1])
        info: ActorInfo = {
            "name": self.host.name,
            "stages": self.stage_addresses,
            "stage_ray_node_ids": [w["ray_node_id"] for w in stage_where],
        }
        self._start_observation()
        return {**info, **_where()}

    async def begin(self, start_wall: float, proxy_address: tuple[str, int]) -> None:
        # The stages' answers (where they run) were had at `start`: nobody reads them again.
        await asyncio.gather(*(stage.begin.remote(start_wall) for stage in self.stages))
        await super().begin(start_wall, proxy_address)

    async def stop(self) -> None:
        await self._close_observation()
        await self.host.close()
        try:
            await asyncio.wait_for(asyncio.gather(*(st.stop.remote() for st in self.stages)), 5.0)
        except Exception:
            pass
        for stage in self.stages:
            ray.kill(stage, no_restart=True)
        self._stopped.set()
