"""Ray actor shells: each wraps a plain node or stage class and only
forwards calls (DESIGN.md: Ray lives in thin adapters). All are async
actors, so a node's engine loop, its gRPC server or puller and the calls
from the proxy share one event loop and never race.

    PrefillNodeActor  -> prefill_node.PrefillNode
    DecodeNodeActor   -> decode_node.DecodeNode, which owns its stage workers
    StageWorkerActor  -> decode_node.stage_worker.StageWorker

The end-of-run report runs `cluster.invariants.check_run` on the node's own
core inside the actor, so the Ray runtime checks exactly what the in-process
runtime checks.
"""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

from cluster.ray_env import ray
from decode_node.node import DecodeNode
from decode_node.settings import WallNodeSettings
from decode_node.stage_worker import StageChainExecutor, StageWorker
from engine.node_core import NodeSpec
from prefill_node.node import PrefillNode

from .invariants import check_run
from .ray_placement import colocated_options, current_node_id
from .run_result import RunResult


def _where() -> dict:
    return {"ray_node_id": current_node_id(), "pid": os.getpid()}


def node_report(node) -> dict:
    """Counters, step records, shadow violations and invariant errors of one node."""
    core = node.core
    view = SimpleNamespace(nodes={node.name: SimpleNamespace(alive=True, core=core)}, _workload={})
    errors = check_run(view, RunResult("wall", 0.0, [], [], {}))
    loop = node.loop
    if loop is not None and loop.error:
        errors.append(f"{node.name}: {loop.error}")
    counters = core.counters()
    counters.update(node.extra_counters())
    violations = [{"node": node.name, **v.to_dict()} for v in core.shadow.violations] if core.shadow else []
    timings = [(t.step_index, t.submitted, t.completed, t.modelled_s, t.wall_s) for t in loop.timings] if loop else []
    return {
        "name": node.name,
        "role": node.role,
        "counters": counters,
        "steps": core.engine.step_records,
        "violations": violations,
        "invariant_errors": errors,
        "timings": timings,
        **_where(),
    }


class _NodeShell:
    """What both node actors share: requests in, quiesce, report, stop."""

    node: PrefillNode | DecodeNode

    def _init_shell(self) -> None:
        self._stopped = asyncio.Event()

    def _send_to(self, proxy):
        name = self.node.name

        def send(events: list[tuple]) -> None:
            proxy.deliver.remote(name, events)  # fire and forget; ordered per caller

        return send

    async def add_requests(self, wires: list[dict]) -> None:
        for wire in wires:
            self.node.add_request(wire)

    def _busy(self) -> bool:
        node = self.node
        if node.loop is None or not node.loop.alive:
            return False
        return not node.loop.is_idle() or getattr(node, "pulls_in_flight", 0) > 0 or getattr(node, "num_held", 0) > 0

    async def quiesce(self, timeout_s: float) -> bool:
        """Wait until nothing is scheduled, in flight, pulled or held; False on timeout."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._busy():
            if asyncio.get_running_loop().time() >= deadline:
                return False
            self.node.loop.wake()
            await asyncio.sleep(0.01)
        return True

    async def report(self) -> dict:
        return node_report(self.node)

    async def wait_stopped(self) -> None:
        """Never returns while the node lives: the proxy's liveness watch."""
        await self._stopped.wait()

    async def stop(self) -> None:
        await self.node.close()
        self._stopped.set()


@ray.remote(num_cpus=0)
class PrefillNodeActor(_NodeShell):
    def __init__(self, spec: NodeSpec, settings: WallNodeSettings) -> None:
        self._init_shell()
        self.node = PrefillNode(spec, settings)

    async def start(self) -> dict:
        address = await self.node.start()
        return {"name": self.node.name, "address": address, **_where()}

    async def begin(self, start_wall: float, proxy) -> None:
        self.node.begin(start_wall, self._send_to(proxy))


@ray.remote(num_cpus=0)
class StageWorkerActor:
    def __init__(self, index: int, pp_size: int, sampler_seed: int, stop_probability: float,
                 link_to_next, link_seed: int, next_stage=None) -> None:
        self.worker = StageWorker(index, pp_size, sampler_seed, stop_probability, link_to_next, link_seed)
        self._next = next_stage

    async def begin(self, start_wall: float) -> dict:
        next_call = None
        if self._next is not None:
            handle = self._next

            async def next_call(share_s, samples):
                return await handle.execute.remote(share_s, samples)

        self.worker.begin(start_wall, next_call)
        return _where()

    async def execute(self, share_s: float, samples: list) -> list:
        return await self.worker.execute(share_s, samples)

    async def stats(self) -> dict:
        return self.worker.stats()


@ray.remote(num_cpus=0)
class DecodeNodeActor(_NodeShell):
    def __init__(self, spec: NodeSpec, settings: WallNodeSettings, stage_name_prefix: str = "") -> None:
        self._init_shell()
        self.spec = spec
        self.settings = settings
        self.stage_name_prefix = stage_name_prefix
        self.stages: list = []
        self.node = DecodeNode(spec, settings, executor_factory=self._stage_executor)

    def _stage_executor(self, clock) -> StageChainExecutor:
        first = self.stages[0]

        async def first_stage(share_s, samples):
            return await first.execute.remote(share_s, samples)

        return StageChainExecutor(first_stage, len(self.stages))

    async def start(self) -> dict:
        """Create the pipeline stages on this machine, last first (each holds
        the handle of the next)."""
        pp = self.spec.pipeline_parallel_size
        s = self.settings
        placement = colocated_options(current_node_id())
        next_stage = None
        stages = []
        for index in reversed(range(pp)):
            options = dict(placement)
            if self.stage_name_prefix:
                options["name"] = f"{self.stage_name_prefix}-stage{index}"
            next_stage = StageWorkerActor.options(**options).remote(
                index, pp, self.spec.sampler_seed, self.spec.stop_probability,
                s.stage_link, s.link_seed * 100 + index, next_stage,
            )
            stages.append(next_stage)
        self.stages = list(reversed(stages))
        return {"name": self.node.name, "stages": len(self.stages), **_where()}

    async def begin(self, start_wall: float, proxy) -> list[dict]:
        where = await asyncio.gather(*(stage.begin.remote(start_wall) for stage in self.stages))
        self.node.begin(start_wall, self._send_to(proxy))
        return list(where)

    async def stage_stats(self) -> list[dict]:
        return list(await asyncio.gather(*(stage.stats.remote() for stage in self.stages)))

    async def stop(self) -> None:
        await self.node.close()
        for stage in self.stages:
            ray.kill(stage, no_restart=True)
        self._stopped.set()
