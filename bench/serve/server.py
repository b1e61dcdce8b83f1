"""Putting `disagg-sim serve` together: a scenario's cluster on the paced
in-process runtime (`driver.py`), the tokenizer, Prometheus series for every
node (`bench/prometheus.py`, rendered on the front door's /metrics) and the
HTTP app (`app.py`). `ServerThread` runs it all in a background thread, for
tests and notebooks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from cluster.spec import ClusterSpec
from engine.records import RequestRecord

from ..observe import LiveObserver
from .app import ServeApp
from .driver import PacedCluster
from .exposition import add_unplaced, merge_families
from .guard import ServeLimits
from .tokenizer import get_tokenizer

DEFAULT_MODEL = "disagg-sim"
LINGER_S = 2.0


class _ServeObserver(LiveObserver):
    """The nodes' exporters, and the requests that finished before any node
    had them (`exposition.add_unplaced`): the in-process proxy reports
    those under the node name "proxy"."""

    def __init__(self, node_names: list[str], model_name: str) -> None:
        super().__init__(node_names, metrics_port=None, model_name=model_name)
        self.model_name = model_name
        self.finished_nowhere: dict[str, int] = {}

    def on_request_finished(self, node_name: str, rec: RequestRecord) -> None:
        if node_name in self.nodes:
            super().on_request_finished(node_name, rec)
        elif rec.finish_reason is not None:
            self.finished_nowhere[rec.finish_reason] = self.finished_nowhere.get(rec.finish_reason, 0) + 1

    def collect(self) -> list[Metric]:
        """One exposition for all nodes (a family may appear only once in a scrape)."""
        merged: dict[str, Metric] = {}
        for exporter in self.exporters.values():
            merge_families(exporter.registry.collect(), merged)
        add_unplaced(merged, self.finished_nowhere, self.model_name)
        return list(merged.values())


def build_app(
    spec: ClusterSpec,
    model_name: str = DEFAULT_MODEL,
    seed: int = 0,
    time_scale: float = 1.0,
    max_pending: int = 512,
    api_keys: Sequence[str] = (),
    limits: ServeLimits | None = None,
) -> ServeApp:
    names = [name for _, node_spec, _ in spec.node_specs() for name in [node_spec.name]]
    observer = _ServeObserver(names, model_name)
    driver = PacedCluster(spec, seed=seed, time_scale=time_scale, max_pending=max_pending, observer=observer)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(observer)

    async def render() -> bytes:
        for name, node in driver.cluster.nodes.items():
            obs = observer.nodes[name]
            if node.alive:
                obs.refresh(node.core.live_gauges(), node.counters())
        return generate_latest(registry)

    return ServeApp(driver, get_tokenizer(), model_name, render, api_keys, limits)


class Listener:
    """The listening socket and the app's runner; `cleanup` stops both."""

    def __init__(self, server: asyncio.Server, runner: web.AppRunner) -> None:
        self.server = server
        self.runner = runner

    async def cleanup(self) -> None:
        self.server.close()  # no new connections
        await self.runner.cleanup()  # aiohttp closes its connections (requests in flight end)


async def start_site(serve_app: ServeApp, host: str, port: int) -> tuple[Listener, int]:
    """Listen on `host`:`port` (0 = ephemeral) with the app's connection guard
    (`guard.py`: header timeout, connection limit) around aiohttp's handler."""
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its request.
    runner = web.AppRunner(
        serve_app.app,
        handler_cancellation=True,
        access_log=None,
        # aiohttp's own idle bound, behind the guard's (which counts what it closes).
        keepalive_timeout=2 * serve_app.limits.header_timeout_s,
        # After an early answer (401, 408, 413) the unread rest of a body is
        # drained for at most this long, then the connection closes (aiohttp: 10 s).
        lingering_time=LINGER_S,
    )
    await runner.setup()
    aiohttp_server = runner.server
    assert aiohttp_server is not None  # set up above
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        serve_app.guard.protocol_factory(aiohttp_server), host, port, reuse_address=True, backlog=1024
    )
    bound = server.sockets[0].getsockname()[1] if server.sockets else port
    return Listener(server, runner), bound


class ServerThread:
    """`disagg-sim serve` in a background thread on 127.0.0.1 (port 0 = ephemeral)."""

    def __init__(self, serve_app: ServeApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self.serve_app = serve_app
        self.loop = asyncio.new_event_loop()
        self._ready: Future = Future()
        self._thread = threading.Thread(target=self._main, args=(host, port), daemon=True, name="disagg-sim-serve")
        self._runner: Listener | None = None
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
        return asyncio.run_coroutine_threadsafe(self.serve_app.query(name, *args), self.loop).result(timeout=30)

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
