"""Live observation of a run: a Prometheus `/metrics` endpoint per node (vLLM's
metric names) and vLLM-style periodic log lines per node, fed by the
runtime's step and request hooks."""

from __future__ import annotations

import logging

from engine.records import RequestRecord, StepRecord

from .loglines import PeriodicStatLogger
from .prometheus import NodeMetricsExporter

logger = logging.getLogger("disagg_sim.stats")


class LiveObserver:
    def __init__(
        self,
        node_names: list[str],
        metrics_port: int | None = None,
        log_interval: float | None = None,
        model_name: str = "disagg-sim",
        style: str = "v1",
    ) -> None:
        """`metrics_port`: None = no HTTP endpoint; 0 = an ephemeral port per
        node; N = node i serves on N + i. `log_interval`: seconds of the run's
        clock between log lines per node (None = no lines)."""
        self.exporters = {n: NodeMetricsExporter(n, model_name=model_name) for n in node_names}
        self.loggers = (
            {n: PeriodicStatLogger(engine_index=i, interval=log_interval, style=style, node_name=n, log=logger)
             for i, n in enumerate(node_names)}
            if log_interval
            else {}
        )
        self.urls: dict[str, str] = {}
        if metrics_port is not None:
            for i, (name, exp) in enumerate(self.exporters.items()):
                exp.start(0 if metrics_port == 0 else metrics_port + i)
                self.urls[name] = exp.url

    def on_step(self, step: StepRecord) -> None:
        exp = self.exporters.get(step.node)
        if exp is not None:
            exp.observe_step(step)
        log = self.loggers.get(step.node)
        if log is not None:
            log.record_step(step)

    def on_request_finished(self, node_name: str, rec: RequestRecord) -> None:
        exp = self.exporters.get(node_name)
        if exp is not None:
            exp.observe_request(rec)

    def sync_counters(self, node_counters: dict[str, dict]) -> None:
        for name, counters in node_counters.items():
            if name in self.exporters:
                self.exporters[name].sync_counters(counters)

    @property
    def log_lines(self) -> list[str]:
        return [line for lg in self.loggers.values() for line in lg.lines]

    def close(self) -> None:
        for exp in self.exporters.values():
            exp.stop()
