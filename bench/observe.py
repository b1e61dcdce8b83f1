"""Live observation of a run: a Prometheus `/metrics` endpoint per node (vLLM's
metric names) and vLLM-style periodic log lines per node, fed by the
runtime's step and request hooks.

- `NodeObserver`: one node's exporter and stats logger.
- `LiveObserver`: every node of an in-process run, in this process.
- `RayLiveObserver`: the same endpoints for a Ray run. Each node actor
  builds its own `NodeObserver` through `start_node_observer` (a
  module-level function, so Ray pickles it by reference and the actor
  imports `bench` itself); the driver relays the actors' stats lines and
  expositions (see `cluster/ray/observe.py`) to endpoints bound here for
  the whole run.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from engine.records import RequestRecord, StepRecord

from .loglines import PeriodicStatLogger
from .metrics_relay import RelayEndpoint
from .prometheus import NodeMetricsExporter

logger = logging.getLogger("disagg_sim.stats")


class _BufferHandler(logging.Handler):
    """Keeps (level, message) pairs until taken: a Ray actor's lines are
    emitted by the driver, which fetches them while the run goes on."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


class NodeObserver:
    """One node's `/metrics` exporter and, with `log_interval`, its periodic
    stats logger. `buffer_lines=True` keeps the lines for `take_log_records()`
    instead of logging them here (a Ray actor's logging does not reach the
    driver)."""

    def __init__(
        self,
        node_name: str,
        engine_index: int = 0,
        log_interval: float | None = None,
        model_name: str = "disagg-sim",
        buffer_lines: bool = False,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.node_name = node_name
        self.engine_index = engine_index
        self.log_interval = log_interval
        labels = dict(labels or {})
        self.exporter = NodeMetricsExporter(node_name, model_name=model_name, extra_labels=tuple(labels))
        if any(labels.values()):
            self.exporter.relabel(**labels)
        self._buffer: _BufferHandler | None = None
        log = logger
        if buffer_lines:
            # A private logger (not in logging's registry), so nothing else sees these records.
            log = logging.Logger(f"disagg_sim.stats.{node_name}", logging.DEBUG)
            self._buffer = _BufferHandler()
            log.addHandler(self._buffer)
        self._log = log
        self.stat_logger = self._new_stat_logger(labels.get("variant"))

    def _new_stat_logger(self, variant: str | None) -> PeriodicStatLogger | None:
        if not self.log_interval:
            return None
        # Stats lines say which variant they belong to: `[fixed/decode-0] Engine 000: ...`.
        name = f"{variant}/{self.node_name}" if variant else self.node_name
        return PeriodicStatLogger(
            engine_index=self.engine_index, interval=self.log_interval, node_name=name, log=self._log
        )

    def begin_run(self, variant: str) -> None:
        """A new run of `variant`: series under its label, stats lines from its t = 0."""
        self.exporter.relabel(variant=variant)
        self.stat_logger = self._new_stat_logger(variant)

    # -- serving ------------------------------------------------------------------
    def start(self, port: int, host: str = "127.0.0.1") -> str:
        self.exporter.start(port, host)
        url = self.exporter.url
        assert url is not None  # (serving now)
        return url

    @property
    def url(self) -> str | None:
        return self.exporter.url

    def exposition(self) -> bytes:
        """The text /metrics would serve now."""
        return self.exporter.render()

    def close(self) -> None:
        self.exporter.stop()

    # -- feeding ------------------------------------------------------------------
    def on_step(self, step: StepRecord) -> None:
        self.exporter.observe_step(step)
        if self.stat_logger is not None:
            self.stat_logger.record_step(step)

    def on_request_finished(self, rec: RequestRecord) -> None:
        self.exporter.observe_request(rec)

    def on_requests_finished(self, records: Iterable[RequestRecord]) -> None:
        for rec in records:
            self.exporter.observe_request(rec)

    def sync_counters(self, counters: Mapping[str, int]) -> None:
        self.exporter.sync_counters(counters)

    def refresh(self, gauges: Mapping[str, Any], counters: Mapping[str, int]) -> None:
        """The node's state between steps: gauges as `update_gauges` takes
        them, counters as the node reports them."""
        self.exporter.update_gauges(**gauges)
        self.exporter.sync_counters(counters)

    @property
    def lines(self) -> list[str]:
        return list(self.stat_logger.lines) if self.stat_logger is not None else []

    def take_log_records(self) -> list[tuple[int, str]]:
        """(logging level, line) emitted since the last call (buffered observers only)."""
        if self._buffer is None:
            return []
        out, self._buffer.records = self._buffer.records, []
        return out


class LiveObserver:
    def __init__(
        self,
        node_names: list[str],
        metrics_port: int | None = None,
        log_interval: float | None = None,
        model_name: str = "disagg-sim",
        labels: tuple[str, ...] = (),
    ) -> None:
        """`metrics_port`: None = no HTTP endpoint; 0 = an ephemeral port per
        node; N = node i serves on N + i. `log_interval`: seconds of the run's
        clock between log lines per node (None = no lines). `labels`: extra
        label names (`("variant",)`), set per run by `begin_run`; the servers
        stay up across runs."""
        self.nodes = {
            n: NodeObserver(
                n,
                engine_index=i,
                log_interval=log_interval,
                model_name=model_name,
                labels={k: "" for k in labels},
            )
            for i, n in enumerate(node_names)
        }
        self._pace: float | None = None
        self._pace_start = 0.0
        self.exporters = {n: o.exporter for n, o in self.nodes.items()}
        self.loggers = {n: o.stat_logger for n, o in self.nodes.items() if o.stat_logger is not None}
        self.urls: dict[str, str] = {}
        if metrics_port is not None:
            try:
                for i, (name, node) in enumerate(self.nodes.items()):
                    self.urls[name] = node.start(0 if metrics_port == 0 else metrics_port + i)
            except BaseException:
                self.close()  # no server left behind when a later port is taken
                raise

    def begin_run(self, variant: str, repeat: int = 0, pace: float | None = None) -> None:
        """A new run: series and stats lines under `variant`; with `pace`, the
        virtual clock is held to `pace` x wall time (1.0 = real time) so a
        dashboard can watch an in-process run unfold."""
        for node in self.nodes.values():
            node.begin_run(variant)
        self.loggers = {n: o.stat_logger for n, o in self.nodes.items() if o.stat_logger is not None}
        self._pace = pace
        self._pace_start = time.monotonic()

    def on_step(self, step: StepRecord) -> None:
        if self._pace is not None:
            # Sleep until the wall clock catches up with the step's virtual time.
            ahead = step.time / self._pace - (time.monotonic() - self._pace_start)
            if ahead > 0:
                time.sleep(ahead)
        node = self.nodes.get(step.node)
        if node is not None:
            node.on_step(step)

    def on_request_finished(self, node_name: str, rec: RequestRecord) -> None:
        node = self.nodes.get(node_name)
        if node is not None:
            node.on_request_finished(rec)

    def sync_counters(self, node_counters: dict[str, dict]) -> None:
        for name, counters in node_counters.items():
            if name in self.nodes:
                self.nodes[name].sync_counters(counters)

    @property
    def log_lines(self) -> list[str]:
        return [line for node in self.nodes.values() for line in node.lines]

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()


# ---- the Ray runtime ---------------------------------------------------------------------


def start_node_observer(
    node_name: str,
    index: int,
    *,
    log_interval: float | None,
    model_name: str = "disagg-sim",
    variant: str | None = None,
) -> NodeObserver:
    """Runs inside a Ray node actor (`cluster.ray.observe.ObserverFactory`):
    the node's exporter, without a server (the driver fetches its
    exposition), and its stats lines buffered for the driver. With `variant`,
    series carry a `variant` label and lines say the variant."""
    return NodeObserver(
        node_name,
        engine_index=index,
        log_interval=log_interval,
        model_name=model_name,
        buffer_lines=True,
        labels={"variant": variant} if variant else None,
    )


class RayLiveObserver:
    """The same endpoints as `LiveObserver` for a Ray `run`: one `/metrics`
    per node name (node i on PORT + i, 0 = ephemeral), bound here once,
    before anything runs, and kept across every run; the driver relays each
    node actor's exposition to its endpoint (`bench/metrics_relay.py`).
    `run_ray_kwargs()` is what `run_ray` needs for one run."""

    def __init__(
        self,
        node_names: list[str],
        metrics_port: int | None = None,
        log_interval: float | None = None,
        model_name: str = "disagg-sim",
    ) -> None:
        if metrics_port is not None and not 0 <= metrics_port <= 65535:
            raise ValueError(f"metrics_port={metrics_port} is invalid; allowed: 0 (ephemeral) to 65535, or None")
        if log_interval is not None and log_interval <= 0:
            raise ValueError(f"log_interval={log_interval} is invalid; allowed: seconds > 0, or None")
        self._base = functools.partial(start_node_observer, log_interval=log_interval, model_name=model_name)
        self.factory = self._base
        self._variant = ""
        self.endpoints: dict[str, RelayEndpoint] = {}
        if metrics_port is not None:
            try:
                for i, name in enumerate(node_names):
                    self.endpoints[name] = RelayEndpoint(0 if metrics_port == 0 else metrics_port + i)
            except BaseException:
                self.close()  # no server left behind when a later port is taken
                raise
        self.urls = {name: endpoint.url for name, endpoint in self.endpoints.items()}

    def begin_run(self, variant: str, repeat: int = 0, pace: float | None = None) -> None:
        """The next run's actors label their series and lines with `variant`."""
        self._variant = variant
        self.factory = functools.partial(self._base, variant=variant)

    def run_ray_kwargs(self) -> dict:
        return {"observer_factory": self.factory, "on_exposition": self.on_exposition}

    def on_exposition(self, node_name: str, exposition: bytes) -> None:
        endpoint = self.endpoints.get(node_name)
        if endpoint is not None:
            endpoint.metrics.update(self._variant, exposition)

    def sync_counters(self, node_counters: dict[str, dict]) -> None:
        """Nothing to do: each actor synced its exporter before its last exposition."""

    def close(self) -> None:
        for endpoint in self.endpoints.values():
            endpoint.close()
        self.endpoints = {}
