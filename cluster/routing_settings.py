"""How the proxy picks a node of a pool: the policy names and the kv_aware
policy's weights (proxy/routing.py holds the policies; docs/fleet.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from proxy.routing import ScoreWeights

from .settings_base import StrictModel, from_setting, settings_for

RoutingPolicy = Literal["round_robin", "least_loaded", "prefix_aware", "kv_aware"]


class RoutingWeights(StrictModel):
    """The kv_aware policy's weights (docs/fleet.md): its prefix-hit, queue-depth and KV-usage scores."""

    prefix: float = from_setting(ScoreWeights, "prefix")
    queue: float = from_setting(ScoreWeights, "queue")
    kv_usage: float = from_setting(ScoreWeights, "kv_usage")

    @model_validator(mode="after")
    def _some_weight(self) -> RoutingWeights:
        if self.prefix == self.queue == self.kv_usage == 0:
            raise ValueError(
                "routing_weights are all 0 (every node would tie); allowed: at least one of prefix, queue, kv_usage > 0"
            )
        return self

    def weights(self) -> ScoreWeights:
        return ScoreWeights(**settings_for(ScoreWeights, self))
