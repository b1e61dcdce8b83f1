"""Live observation on the Ray runtime: a Prometheus `/metrics` endpoint in
every node actor and vLLM-style stats lines per node, while the run goes on.

Who does what:
- Each node actor builds its own observer with the `ObserverFactory` the
  caller passed to `run_ray` (bench's `start_node_observer`; `cluster` does
  not import `bench`, it only calls what it is given). The observer serves
  `/metrics` from the actor's process on the node's own address (127.0.0.1
  on a local cluster) and is fed by the node's own engine: every step
  (the node's `on_step`: running/waiting gauges, KV usage, preemption
  counters) and every `REFRESH_S` the node's live gauges and full counters
  (the simulator's `disagg_sim:` series, and gauges that reflect an idle
  node instead of its last step).
- Request latency histograms (TTFT, ITL, E2EL, queue time, TPOT) are
  observed where the request records are: the driver builds a
  `RequestRecord` per request from the proxy's client stream and sends each
  finished record to the exporter of the node that served it (the decode
  node; a prefill node for a request that ended there). So a node's
  histograms use the client's times, as `vllm bench serve` measures them.
- Stats lines are formatted inside the node actor (from its own steps, on
  the run clock) and relayed by the driver, which polls the actors every
  `LINE_POLL_S` and logs them on `disagg_sim.stats` (Ray does not forward an
  actor's logging to the driver unless `log_to_driver` is on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from engine.records import RequestRecord, StepRecord
from node.role import NodeRole

logger = logging.getLogger(__name__)
stats_logger = logging.getLogger("disagg_sim.stats")

REFRESH_S = 0.5  # live gauges and counters between steps, per node
LINE_POLL_S = 0.25  # the driver fetches the nodes' stats lines this often


class NodeObserver(Protocol):
    """What a node actor feeds (bench's `NodeObserver` implements it)."""

    @property
    def url(self) -> str | None: ...

    def on_step(self, step: StepRecord) -> None: ...

    def on_requests_finished(self, records: list[RequestRecord]) -> None: ...

    def refresh(self, gauges: Mapping[str, float], counters: Mapping[str, int]) -> None: ...

    def take_log_records(self) -> list[tuple[int, str]]: ...

    def close(self) -> None: ...


# (node name, node index in `ClusterSpec.node_specs()` order, host to serve on) -> a started observer.
ObserverFactory = Callable[[str, int, str], NodeObserver]


class ActorObservation:
    """One node actor's observer, fed from the node's own engine. A failing
    observer is reported (`errors`) and switched off; it never stops the node."""

    def __init__(self, factory: ObserverFactory, index: int, node: NodeRole) -> None:
        self.factory = factory
        self.index = index
        self.node = node
        self.observer: NodeObserver | None = None
        self.errors: list[str] = []
        self._refresher: asyncio.Task | None = None

    def start(self, host: str) -> str | None:
        """Build the observer (its HTTP server binds here); the node's steps come through `on_step`."""
        self.observer = self.factory(self.node.name, self.index, host)
        return self.observer.url

    def begin(self) -> None:
        if self.observer is not None:
            self._refresher = asyncio.ensure_future(self._refresh_loop())

    def _fail(self, what: str, err: Exception) -> None:
        msg = f"{self.node.name}: observer {what} failed, observation off: {type(err).__name__}: {err}"
        logger.error(msg)
        self.errors.append(msg)
        if self._refresher is not None:
            self._refresher.cancel()

    def on_step(self, step: StepRecord) -> None:
        if self.observer is None or self.errors:
            return
        try:
            self.observer.on_step(step)
        except Exception as err:
            self._fail("on_step", err)

    def refresh(self) -> None:
        if self.observer is None or self.errors:
            return
        try:
            self.observer.refresh(self.node.core.live_gauges(), self.node.counters())
        except Exception as err:
            self._fail("refresh", err)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            self.refresh()

    def observe_requests(self, records: list[RequestRecord]) -> None:
        if self.observer is None or self.errors:
            return
        try:
            self.observer.on_requests_finished(records)
        except Exception as err:
            self._fail("on_requests_finished", err)

    def take_log_records(self) -> list[tuple[int, str]]:
        return self.observer.take_log_records() if self.observer is not None else []

    async def close(self) -> None:
        """Stop feeding and close the HTTP server (its port is free when this returns)."""
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        observer, self.observer = self.observer, None
        if observer is not None:
            # The server's shutdown waits for its serving thread: not on the event loop.
            await asyncio.to_thread(observer.close)


class DriverObservation:
    """The driver's part: finished records to their node's exporter, and
    the nodes' stats lines to the driver's log while the run goes on."""

    def __init__(self, nodes: dict[str, object], clock) -> None:
        self.nodes = nodes  # name -> node actor handle
        self.clock = clock
        self.lines: list[tuple[float, str]] = []  # (run time the driver logged it, line)
        self._pending: list = []
        self._dead: set[str] = set()

    def forget(self, name: str) -> None:
        """A killed node gets nothing more."""
        self._dead.add(name)

    def on_finished(self, finished: list[tuple[str, RequestRecord]]) -> None:
        by_node: dict[str, list[RequestRecord]] = {}
        for node, rec in finished:
            if node in self.nodes and node not in self._dead:
                by_node.setdefault(node, []).append(rec)
        for node, records in by_node.items():
            self._pending.append(self.nodes[node].observe_requests.remote(records))

    async def flush(self, timeout_s: float) -> None:
        """Every record sent so far has been observed (or its node is gone)."""
        pending, self._pending = self._pending, []
        if pending:
            try:
                await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout_s)
            except TimeoutError:
                logger.warning("%d latency update(s) did not reach their node within %.0f s", len(pending), timeout_s)

    async def poll_lines(self) -> None:
        while True:
            await asyncio.sleep(LINE_POLL_S)
            await self.fetch_lines(LINE_POLL_S * 20)

    async def fetch_lines(self, timeout_s: float) -> None:
        live = [n for n in self.nodes if n not in self._dead]
        try:
            batches = await asyncio.wait_for(
                asyncio.gather(*(self.nodes[n].take_stats_lines.remote() for n in live), return_exceptions=True),
                timeout_s,
            )
        except TimeoutError:
            return
        now = self.clock.now()
        for batch in batches:
            if isinstance(batch, BaseException):
                continue  # a node killed by a fault: its lines went with it
            for level, line in batch:
                stats_logger.log(level, "%s", line)
                self.lines.append((round(now, 3), line))
