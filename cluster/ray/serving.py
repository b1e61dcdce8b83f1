"""A Ray run that serves clients instead of replaying a workload
(`disagg-sim serve` on the Ray runtime).

The same actors as `run_ray` (a proxy pinned to this machine, the prefill
and decode node actors, the decode nodes' stage workers), started the same
way; then, instead of a load driver, a front door is built inside the proxy
actor by `front_factory(proxy_actor, nodes, *front_args)` (bench's OpenAI
HTTP server: `cluster` does not import `bench`, it only runs what it is
given). Requests go from the front door to the proxy's router in the same
process and event loop, the nodes' events come back the same way; nothing
goes through this driver process while serving.

    serving = RayServing(handle, spec, seed, observer_factory, start_front, args)
    port = serving.start()
    serving.query("counts")      # the front door's state (tests, tools)
    serving.close()              # front door, then every actor of the run

Time is the Ray runtime's (`runtime.py`): step durations are slept as
`modelled * spec.time_scale`; link delays and timeouts are wall seconds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cluster.ray.env import ray

from ..spec import ClusterSpec
from .cluster import RayClusterHandle
from .handles import ActorRef
from .observe import ObserverFactory
from .proxy import FrontFactory
from .ray_run import CALL_TIMEOUT_S, START_LEAD_S, RayRun

logger = logging.getLogger(__name__)


class RayServing:
    def __init__(
        self,
        handle: RayClusterHandle,
        spec: ClusterSpec,
        seed: int,
        observer_factory: ObserverFactory | None,
        front_factory: FrontFactory,
        front_args: tuple = (),
    ) -> None:
        if not handle.started or handle.closed:
            raise RuntimeError("RayServing: the RayClusterHandle is not open; use it as a context manager")
        self.run = RayRun(handle, spec, seed, None, observer_factory)
        self.front_factory = front_factory
        self.front_args = front_args
        self.port: int | None = None

    @property
    def nodes(self) -> dict[str, ActorRef]:
        return self.run.nodes

    def start(self) -> int:
        """Start every actor, the run clock and the front door; returns its port."""
        run = self.run
        try:
            run.launch()
            start_wall = time.time() + START_LEAD_S
            roles = {r: {n: a for n, a in run.nodes.items() if run.roles[n] == r} for r in ("prefill", "decode")}
            proxy = run.proxy_actor()
            proxy_address = ray.get(
                proxy.begin.remote(
                    run.spec.model_dump_json(),
                    run.seed,
                    start_wall,
                    roles["prefill"],
                    roles["decode"],
                    run.secret,
                    run.kv_tls,  # the nodes' links use the run's TLS when it is on
                ),
                timeout=CALL_TIMEOUT_S,
            )
            ray.get([a.begin.remote(start_wall, proxy_address) for a in run.nodes.values()], timeout=CALL_TIMEOUT_S)
            port: int = ray.get(
                proxy.serve_front.remote(self.front_factory, dict(run.nodes), *self.front_args),
                timeout=CALL_TIMEOUT_S,
            )
            self.port = port
        except BaseException:
            self.close()
            raise
        return port

    def query(self, name: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """The front door's answer (`FrontDoor.query`), pickled across Ray: its shape is the query's."""
        return ray.get(self.run.proxy_actor().front_query.remote(name, *args), timeout=timeout_s)

    def close(self) -> None:
        """Stop the front door (open requests are aborted), then every actor of the run."""
        proxy = self.run.proxy
        if proxy is not None:
            try:
                ray.get(proxy.stop_front.remote(), timeout=CALL_TIMEOUT_S)
            except Exception as err:  # the proxy is gone: teardown kills the rest
                logger.warning("serving: the front door did not stop cleanly: %s", type(err).__name__)
        self.run.teardown()
