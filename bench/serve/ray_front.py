"""The OpenAI front door on the Ray runtime, inside the proxy actor.

`start_ray_front` runs in the `ProxyActor` (`cluster/ray/proxy.py`,
`serve_front`): it builds the same `ServeApp` as the in-process server over
a `RouterDriver`, which submits to and aborts in the proxy's router
(`proxy/proxy.py`) directly, in the actor's event loop, and
keeps each request's `RequestRecord` from the router's client events (times
in run seconds, stamped by the proxy as it hears them, as in `run_ray`).

- A client that goes away: `Proxy.abort` finishes the request "abort",
  sends an `AbortMessage` to the node that has it (its engine aborts it and
  frees its blocks; the node counts it, `requests_aborted`) and releases a
  prompt a prefill node holds for it.
- /metrics: every node actor keeps its exporter (vLLM's names,
  `bench/observe.py`); a scrape asks each for its exposition and renders
  them as one (a family appears once). Finished records go to the exporter
  of the node that served them, for the latency histograms (as `run_ray`'s
  driver does).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from engine.records import RequestRecord, WorkloadRequest
from proxy.client import Arrived, ClientEvent, Finished, Submission, apply_to_record

from ..observe import start_node_observer
from .app import ServeApp
from .exposition import Families, add_unplaced, merge_families
from .guard import ServeLimits
from .server import Listener, start_site
from .streams import KEEP_STEPS, TRIM_EVERY, ServeDriver
from .tokenizer import get_tokenizer

SCRAPE_TIMEOUT_S = 10.0


def serve_observer_factory(model_name: str):
    """The node actors' observer: an exporter, no stats lines."""
    return functools.partial(start_node_observer, log_interval=None, model_name=model_name)


class RouterDriver(ServeDriver):
    runtime = "ray"

    def __init__(
        self, server, nodes: dict[str, Any], max_model_len: int, max_pending: int, model_name: str = "disagg-sim"
    ) -> None:
        super().__init__(max_model_len, max_pending)
        self.model_name = model_name
        self.finished_nowhere: dict[str, int] = {}  # finish reason -> requests no node had (exposition.py)
        self.server = server  # cluster.ray.proxy.ProxyServer
        self.router = server.proxy  # proxy.Proxy
        self.clock = server.clock
        self.nodes = nodes  # name -> node actor handle
        self.records: dict[str, RequestRecord] = {}
        # The last latency update sent to each node: an actor runs one caller's
        # calls in order, so when it is done every earlier one is (a long-lived
        # server keeps no list of them).
        self._last_update: dict[str, Any] = {}
        self._forgotten = 0

    # -- events from the router (in this actor's loop) ------------------------------------
    def on_events(self, events: list[ClientEvent]) -> None:
        records = self.records
        finished: list[tuple[str, RequestRecord]] = []
        for ev in events:
            rec = records.get(ev.request_id)
            if rec is None:
                continue
            if isinstance(ev, Arrived):
                rec.arrival_time = ev.time
            elif apply_to_record(rec, ev):
                assert isinstance(ev, Finished)
                finished.append((ev.node, rec))
        if finished:
            self._observe(finished)
        self._notify([ev.request_id for ev in events])

    def _observe(self, finished: list[tuple[str, RequestRecord]]) -> None:
        """Finished records to the node that served them (its latency histograms)."""
        by_node: dict[str, list[RequestRecord]] = {}
        for node, rec in finished:
            if node in self.nodes:
                if node not in self.router.dead:
                    by_node.setdefault(node, []).append(rec)
            elif rec.finish_reason is not None:  # ended before any node had it
                self.finished_nowhere[rec.finish_reason] = self.finished_nowhere.get(rec.finish_reason, 0) + 1
        for node, records in by_node.items():
            self._last_update[node] = self.nodes[node].observe_requests.remote(records)

    def clock_origin(self) -> tuple[float, float]:
        # Run seconds are wall seconds on Ray (a node sleeps its steps x time_scale).
        return self.clock.epoch, 1.0

    # -- the cluster's side of a request -------------------------------------------------
    def _submit(self, w: WorkloadRequest) -> RequestRecord:
        rec = self.records[w.request_id] = RequestRecord(
            w.request_id, self.clock.now(), w.prompt_len, w.output_len, w.priority
        )
        item = Submission.of(w)
        self.server.submit([item])
        return rec

    def _abort(self, request_id: str) -> None:
        self.server.abort(request_id)

    def _forget(self, request_id: str) -> None:
        # A long-lived server keeps nothing of a request its client is done with.
        self.records.pop(request_id, None)
        self.router.failures.pop(request_id, None)
        self.router.rerouted.pop(request_id, None)
        self._forgotten += 1
        if self._forgotten % TRIM_EVERY == 0:
            for name, node in self.nodes.items():
                if name not in self.router.dead:
                    node.trim_history.remote(KEEP_STEPS)

    def requests_aborted(self) -> int:
        return self.router.requests_aborted

    async def engine_state(self) -> dict[str, dict]:
        names = [n for n in self.nodes if n not in self.router.dead]
        states = await asyncio.wait_for(
            asyncio.gather(*(self.nodes[n].engine_state.remote() for n in names)), SCRAPE_TIMEOUT_S
        )
        return dict(zip(names, states))

    # -- /metrics ------------------------------------------------------------------------
    async def render_metrics(self) -> bytes:
        """Every live node's exposition, merged into one family per name."""
        names = [n for n in self.nodes if n not in self.router.dead]
        updates = [self._last_update.pop(n) for n in names if n in self._last_update]
        if updates:  # every finished record observed first
            await asyncio.wait_for(asyncio.gather(*updates, return_exceptions=True), SCRAPE_TIMEOUT_S)
        taken = await asyncio.wait_for(
            asyncio.gather(*(self.nodes[n].exposition_now.remote() for n in names), return_exceptions=True),
            SCRAPE_TIMEOUT_S,
        )
        merged: dict[str, Metric] = {}
        for got in taken:
            if isinstance(got, BaseException) or got is None:
                continue  # a node that died meanwhile
            merge_families(text_string_to_metric_families(got.decode()), merged)
        add_unplaced(merged, self.finished_nowhere, self.model_name)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Families(list(merged.values())))
        return generate_latest(registry)


class RayFront:
    """The started front door (`cluster.ray.proxy.FrontDoor`)."""

    def __init__(self, app: ServeApp, runner: Listener, port: int) -> None:
        self.app = app
        self.runner = runner
        self.port = port

    async def query(self, name: str, *args: Any) -> Any:
        return await self.app.query(name, *args)

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_ray_front(
    proxy,
    nodes: dict[str, Any],
    host: str,
    port: int,
    model_name: str,
    max_pending: int,
    max_model_len: int,
    api_keys: tuple[str, ...] = (),
    limits: ServeLimits | None = None,
) -> RayFront:
    """In the proxy actor, after its `begin`: the HTTP server on `host`:`port` (0 = ephemeral)."""
    driver = RouterDriver(proxy.server, nodes, max_model_len, max_pending, model_name)
    proxy.on_events = driver.on_events
    app = ServeApp(driver, get_tokenizer(), model_name, driver.render_metrics, api_keys, limits)
    runner, bound = await start_site(app, host, port)
    return RayFront(app, runner, bound)
