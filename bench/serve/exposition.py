"""One /metrics exposition for the front door, on both runtimes: every
node's families merged (a family may appear only once in a scrape), plus
the requests that finished before any node had them.

A request aborted while it waits in the proxy's API-server queue (or on
its way to its first node) never reaches an engine, so no node's exporter
counts it; vLLM counts every finished request in
`vllm:request_success_total{finished_reason}`. Those are counted under
`engine="proxy"`, so the abort count a client can scrape is every abort.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

SUCCESS_FAMILY = "vllm:request_success"
UNPLACED_ENGINE = "proxy"


def merge_families(families: Iterable[Metric], into: dict[str, Metric] | None = None) -> dict[str, Metric]:
    merged = {} if into is None else into
    for fam in families:
        have = merged.get(fam.name)
        if have is None:
            have = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        have.samples.extend(fam.samples)
    return merged


def add_unplaced(merged: dict[str, Metric], finished_nowhere: Mapping[str, int], model_name: str) -> None:
    """`finished_nowhere`: finish reason -> requests that ended before any node had them."""
    if not finished_nowhere:
        return
    fam = merged.get(SUCCESS_FAMILY)
    if fam is None:
        fam = merged[SUCCESS_FAMILY] = Metric(SUCCESS_FAMILY, "Count of successfully processed requests.", "counter")
    for reason, n in sorted(finished_nowhere.items()):
        labels = {"engine": UNPLACED_ENGINE, "finished_reason": reason, "model_name": model_name}
        fam.samples.append(Sample(SUCCESS_FAMILY + "_total", labels, float(n)))


class Families:
    """A prometheus_client collector over ready families."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families
