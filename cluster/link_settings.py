"""The links of a scenario's cluster (`cluster.links`): proxy <-> nodes, the
KV hand-off, pipeline stages; each one's delay, jitter, bandwidth, loss and
outages, turned into the `LinkSpec` the link model runs (connector/link.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from connector.link import JitterDistribution, LinkSpec

from .settings_base import MAX_RUN_S, StrictModel, from_setting, settings_for

OutageStart = Annotated[float, Field(ge=0, le=MAX_RUN_S)]
OutageEnd = Annotated[float, Field(gt=0, allow_inf_nan=True)]


class LinkSettings(StrictModel):
    """One link's impairments; each setting is declared on `LinkSpec`."""

    delay_ms: float = from_setting(LinkSpec, "delay_ms")
    jitter_ms: float = from_setting(LinkSpec, "jitter_ms")
    jitter_distribution: JitterDistribution = from_setting(LinkSpec, "jitter_distribution")
    bandwidth_MBps: float | None = from_setting(LinkSpec, "bandwidth_MBps")
    loss: float = from_setting(LinkSpec, "loss")
    outages: list[tuple[OutageStart, OutageEnd]] = from_setting(
        LinkSpec, "outages", default_factory=list, max_length=10_000
    )

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
        return LinkSpec(**{**settings_for(LinkSpec, self), "outages": tuple(self.outages)})


class LinksSpec(StrictModel):
    proxy: LinkSettings = Field(default_factory=LinkSettings)
    kv: LinkSettings = Field(default_factory=LinkSettings)
    stage: LinkSettings = Field(default_factory=LinkSettings)
