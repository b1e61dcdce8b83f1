"""`disagg-sim serve` on the Ray runtime, from the driver's side: the
scenario's cluster as Ray actors (`cluster/ray/serving.py`) with the
OpenAI front door inside the proxy actor (`ray_front.py`). The same
surface as `ServerThread` (`base_url`, `port`, `query`, `close`), so tests
and the CLI treat both runtimes alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cluster.ray.cluster import RayClusterHandle
from cluster.spec import ClusterSpec

from .guard import ServeLimits
from .ray_front import serve_observer_factory, start_ray_front
from .server import DEFAULT_MODEL


class RayServer:
    def __init__(
        self,
        spec: ClusterSpec,
        handle: RayClusterHandle,
        model_name: str = DEFAULT_MODEL,
        seed: int = 0,
        time_scale: float = 1.0,
        max_pending: int = 512,
        host: str = "127.0.0.1",
        port: int = 0,
        api_keys: Sequence[str] = (),
        limits: ServeLimits | None = None,
    ) -> None:
        from cluster.ray.serving import RayServing

        if not time_scale > 0:
            raise ValueError(f"time_scale={time_scale!r} is invalid; allowed: > 0")
        # On Ray the time scale is the cluster's: modelled step time x time_scale is slept.
        spec = spec.model_copy(update={"time_scale": time_scale})
        max_model_len = min(g.engine.max_model_len for g in (spec.prefill, spec.decode) if g.count)
        self.serving = RayServing(
            handle,
            spec,
            seed,
            serve_observer_factory(model_name),
            start_ray_front,
            (host, port, model_name, max_pending, max_model_len, tuple(api_keys), limits),
        )
        self.port = self.serving.start()
        self.base_url = f"http://{host}:{self.port}"
        self._closed = False

    def query(self, name: str, *args: Any) -> Any:
        """`ServeDriver.query`, asked of the front door in the proxy actor."""
        return self.serving.query(name, *args)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.serving.close()

    def __enter__(self) -> RayServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
