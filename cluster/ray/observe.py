"""Live observation on the Ray runtime: vLLM-style `/metrics` series and
stats lines per node, while the run goes on.

Who does what:
- Each node actor builds its own observer with the `ObserverFactory` the
  caller passed to `run_ray` (bench's `start_node_observer`; `cluster` does
  not import `bench`, it only calls what it is given). The observer keeps a
  Prometheus exporter without an HTTP server, fed by the node's own engine:
  every step (the node's `on_step`: running/waiting gauges, KV usage,
  preemption counters) and every `REFRESH_S` the node's live gauges and full
  counters (the simulator's `disagg_sim:` series, and gauges that reflect an
  idle node instead of its last step).
- The driver fetches every node's text exposition every `POLL_S` and once
  more after the nodes reported, and hands it to `on_exposition(node,
  text)`: bench serves it on one endpoint per node name that outlives the
  run's actors (`bench/metrics_relay.py`), so one scrape target covers every
  run of a `disagg-sim run`.
- Request latency histograms (TTFT, ITL, E2EL, queue time, TPOT) are
  observed where the request records are: the driver builds a
  `RequestRecord` per request from the proxy's client stream and sends each
  finished record to the exporter of the node that served it (the decode
  node; a prefill node for a request that ended there). So a node's
  histograms use the client's times, as `vllm bench serve` measures them.
- Stats lines are formatted inside the node actor (from its own steps, on
  the run clock) and relayed by the driver in the same poll, which logs them
  on `disagg_sim.stats` (Ray does not forward an actor's logging to the
  driver unless `log_to_driver` is on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from cluster.wall.clock import RunClock
from engine.records import RequestRecord, StepRecord
from node.role import NodeRole

from .handles import ActorRef

logger = logging.getLogger(__name__)
stats_logger = logging.getLogger("disagg_sim.stats")

REFRESH_S = 0.5  # live gauges and counters between steps, per node
POLL_S = 0.25  # the driver fetches the nodes' stats lines and expositions this often


class NodeObserver(Protocol):
    """What a node actor feeds (bench's `NodeObserver` implements it)."""

    def on_step(self, step: StepRecord) -> None: ...

    def on_requests_finished(self, records: list[RequestRecord]) -> None: ...

    def refresh(self, gauges: Mapping[str, float], counters: Mapping[str, int]) -> None: ...

    def take_log_records(self) -> list[tuple[int, str]]: ...

    def exposition(self) -> bytes: ...


# (node name, node index in `ClusterSpec.node_specs()` order) -> an observer.
ObserverFactory = Callable[[str, int], NodeObserver]
# (node name, its text exposition): where the driver hands what it fetched.
ExpositionSink = Callable[[str, bytes], None]


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

    def start(self) -> None:
        """Build the observer; the node's steps come through `on_step`."""
        self.observer = self.factory(self.node.name, self.index)

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

    def take(self) -> tuple[list[tuple[int, str]], bytes | None]:
        """(stats lines since the last call, the exposition now) for the driver."""
        if self.observer is None:
            return [], None
        try:
            return self.observer.take_log_records(), self.observer.exposition()
        except Exception as err:
            self._fail("exposition", err)
            return [], None

    def close(self) -> None:
        """Stop feeding."""
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        self.observer = None


class DriverObservation:
    """The driver's part: finished records to their node's exporter, and
    the nodes' stats lines (to the driver's log) and expositions (to
    `on_exposition`) while the run goes on."""

    def __init__(
        self, nodes: dict[str, ActorRef], clock: RunClock, on_exposition: ExpositionSink | None = None
    ) -> None:
        self.nodes = nodes
        self.clock = clock
        self.on_exposition = on_exposition
        self.lines: list[tuple[float, str]] = []  # (run time the driver logged it, line)
        self._pending: list[ActorRef] = []  # refs of `observe_requests` calls not yet awaited
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

    async def poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            await self.fetch(POLL_S * 20)

    async def fetch(self, timeout_s: float) -> None:
        """Every live node's stats lines since the last fetch and its exposition now."""
        live = [n for n in self.nodes if n not in self._dead]
        try:
            taken = await asyncio.wait_for(
                asyncio.gather(*(self.nodes[n].take_observation.remote() for n in live), return_exceptions=True),
                timeout_s,
            )
        except TimeoutError:
            return
        now = self.clock.now()
        for name, got in zip(live, taken):
            if isinstance(got, BaseException):
                continue  # a node killed by a fault: its last exposition stays where it was handed
            batch, exposition = got
            for level, line in batch:
                stats_logger.log(level, "%s", line)
                self.lines.append((round(now, 3), line))
            if exposition is not None and self.on_exposition is not None:
                self.on_exposition(name, exposition)
