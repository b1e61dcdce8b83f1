"""Putting `disagg-sim serve` together: a scenario's cluster on the paced
in-process runtime (`driver.py`), the tokenizer, Prometheus series for every
node (`bench/prometheus.py`, rendered on the front door's /metrics) and the
HTTP app (`app.py`). `ServerThread` runs it all in a background thread, for
tests and notebooks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from cluster.spec import ClusterSpec

from ..observe import LiveObserver
from .app import ServeApp
from .driver import PacedCluster
from .tokenizer import get_tokenizer

DEFAULT_MODEL = "disagg-sim"


class _MergedNodes:
    """One exposition for all nodes: each node's exporter has its own
    registry, and a family may appear only once in a scrape."""

    def __init__(self, observer: LiveObserver) -> None:
        self.observer = observer

    def collect(self):
        families: dict[str, Metric] = {}
        for exporter in self.observer.exporters.values():
            for fam in exporter.registry.collect():
                have = families.get(fam.name)
                if have is None:
                    have = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                have.samples.extend(fam.samples)
        return list(families.values())


def build_app(
    spec: ClusterSpec, model_name: str = DEFAULT_MODEL, seed: int = 0, time_scale: float = 1.0, max_pending: int = 512
) -> ServeApp:
    names = [name for _, node_spec, _ in spec.node_specs() for name in [node_spec.name]]
    observer = LiveObserver(names, metrics_port=None, model_name=model_name)
    driver = PacedCluster(spec, seed=seed, time_scale=time_scale, max_pending=max_pending, observer=observer)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_MergedNodes(observer))

    async def render() -> bytes:
        for name, node in driver.cluster.nodes.items():
            obs = observer.nodes[name]
            if node.alive:
                obs.refresh(node.core.live_gauges(), node.counters())
        return generate_latest(registry)

    return ServeApp(driver, get_tokenizer(), model_name, render)


async def start_site(serve_app: ServeApp, host: str, port: int) -> tuple[web.AppRunner, int]:
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its request.
    runner = web.AppRunner(serve_app.app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    bound = server.sockets[0].getsockname()[1] if server is not None and server.sockets else port  # type: ignore[attr-defined]  # (an asyncio.Server; aiohttp types it as AbstractServer)
    return runner, bound


class ServerThread:
    """`disagg-sim serve` in a background thread on 127.0.0.1 (port 0 = ephemeral)."""

    def __init__(self, serve_app: ServeApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self.serve_app = serve_app
        self.loop = asyncio.new_event_loop()
        self._ready: Future = Future()
        self._thread = threading.Thread(target=self._main, args=(host, port), daemon=True, name="disagg-sim-serve")
        self._runner: web.AppRunner | None = None
        self._thread.start()
        self.port: int = self._ready.result(timeout=30)
        self.base_url = f"http://{host}:{self.port}"

    def _main(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self._runner, bound = self.loop.run_until_complete(start_site(self.serve_app, host, port))
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._ready.set_result(bound)
        self.loop.run_forever()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the server's loop (the cluster is not thread-safe) and return its result."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def query(self, name: str, *args: Any) -> Any:
        """`ServeDriver.query` on the server's loop (as `RayServer.query` asks the proxy actor)."""
        return asyncio.run_coroutine_threadsafe(self.serve_app.driver.query(name, *args), self.loop).result(timeout=30)

    def close(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def serve_forever(serve_app: ServeApp, host: str, port: int, on_ready: Callable[[int], None]) -> None:
    runner, bound = await start_site(serve_app, host, port)
    on_ready(bound)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
