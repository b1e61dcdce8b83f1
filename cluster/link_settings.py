"""The links of a scenario's cluster (`cluster.links`): proxy <-> nodes, the
KV hand-off, pipeline stages; each one's delay, jitter, bandwidth, loss and
outages, turned into the `LinkSpec` the link model runs (connector/link.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from connector.link import LinkSpec

from .settings_base import MAX_BANDWIDTH_MBPS, MAX_LINK_MS, MAX_RUN_S, MIN_BANDWIDTH_MBPS, StrictModel

OutageStart = Annotated[float, Field(ge=0, le=MAX_RUN_S)]
OutageEnd = Annotated[float, Field(gt=0, allow_inf_nan=True)]


class LinkSettings(StrictModel):
    delay_ms: float = Field(0.0, ge=0, le=MAX_LINK_MS)
    jitter_ms: float = Field(0.0, ge=0, le=MAX_LINK_MS)
    jitter_distribution: Literal["normal", "uniform"] = "normal"
    bandwidth_MBps: float | None = Field(None, ge=MIN_BANDWIDTH_MBPS, le=MAX_BANDWIDTH_MBPS)
    loss: float = Field(0.0, ge=0, lt=1)
    # (start_s, end_s) run seconds; end_s may be .inf (down for the rest of the run).
    outages: list[tuple[OutageStart, OutageEnd]] = Field(default_factory=list, max_length=10_000)

    @model_validator(mode="after")
    def _outage_windows(self) -> LinkSettings:
        for i, (start, end) in enumerate(self.outages):
            if not start < end:
                raise ValueError(
                    f"outages[{i}]=[{start:g}, {end:g}] is invalid; allowed: [start_s, end_s] with start_s < end_s "
                    "(end_s may be .inf)"
                )
        return self

    def to_spec(self) -> LinkSpec:
        return LinkSpec(
            delay_ms=self.delay_ms,
            jitter_ms=self.jitter_ms,
            jitter_distribution=self.jitter_distribution,
            bandwidth_MBps=self.bandwidth_MBps,
            loss=self.loss,
            outages=tuple(self.outages),
        )


class LinksSpec(StrictModel):
    proxy: LinkSettings = Field(default_factory=LinkSettings)
    kv: LinkSettings = Field(default_factory=LinkSettings)
    stage: LinkSettings = Field(default_factory=LinkSettings)
