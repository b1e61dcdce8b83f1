"""One `/metrics` endpoint per node name for a whole Ray `run`, served by the
driver and fed with what the node actors expose.

A Ray run's node actors live for one run (one variant x repeat), so an
endpoint in an actor would change its port with every run and vanish between
runs: a Prometheus scrape config could not follow it. Instead each actor keeps
its exporter without a server, the driver fetches its text exposition while
the run goes on (`cluster/ray/observe.py`), and the endpoint bound here once,
before anything runs, serves the latest exposition of every run of that node
name. Series carry the run's `variant` label, so the runs of one node name
stay apart; a later repeat of a variant replaces the earlier one's series
(a Prometheus counter reset), as a restarted vLLM server's would.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector


class RelayedMetrics(Collector):
    """The latest exposition of each run of one node name, merged into one
    family per metric name (a text exposition may name a family only once)."""

    def __init__(self) -> None:
        self._by_run: dict[str, list[Metric]] = {}

    def update(self, run_key: str, exposition: bytes | str) -> None:
        """Replace what `run_key` (the run's variant) exposes."""
        text = exposition.decode() if isinstance(exposition, bytes) else exposition
        self._by_run[run_key] = list(text_string_to_metric_families(text))

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for families in list(self._by_run.values()):
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples.extend(family.samples)
        yield from merged.values()


class RelayEndpoint:
    """A node name's `/metrics`, bound on `host`:`port` (0 = ephemeral)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.metrics = RelayedMetrics()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.metrics)
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
