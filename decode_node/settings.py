"""What a wall-clock node needs besides its `NodeSpec`: how step time maps
to wall time, the links it sits behind, and the KV handoff's timing policy.
Built by the cluster adapter from a `ClusterSpec`; plain data so it pickles
into a Ray actor."""

from __future__ import annotations

from dataclasses import dataclass

from connector.link import LinkSpec
from engine.cost_model import CostModel

from .wall_clock import RunClock


@dataclass(frozen=True)
class WallNodeSettings:
    cost_model: CostModel
    # Wall seconds slept per modelled second of step time.
    time_scale: float = 1.0
    # KV payload per token (bytes) of the synthetic blocks.
    bytes_per_token: int = 64
    # Between pipeline stages (decode node) and on the KV handoff (consumer
    # side: the puller's channels). None or an ideal spec: no impairment.
    stage_link: LinkSpec | None = None
    kv_link: LinkSpec | None = None
    # Seeds every link this node opens (channels in the order they are opened).
    link_seed: int = 0
    # KV pull policy in wall seconds (not scaled): one attempt, the whole pull.
    kv_pull_timeout_s: float = 2.0
    kv_pull_deadline_s: float = 10.0
    max_concurrent_pulls: int = 64
    # Producer: free blocks whose consumer never reported within this many
    # wall seconds (vLLM's NIXL connector does the same with
    # VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s by default).
    kv_hold_timeout_s: float = 120.0
    # Host the producer's KV server binds and advertises.
    kv_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        for name in ("time_scale", "kv_pull_timeout_s", "kv_pull_deadline_s", "kv_hold_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"WallNodeSettings.{name}={value!r} is invalid; allowed: a number > 0")
        if self.bytes_per_token < 1:
            raise ValueError(f"WallNodeSettings.bytes_per_token={self.bytes_per_token!r} is invalid; allowed: >= 1")
        if self.max_concurrent_pulls < 1:
            raise ValueError(
                f"WallNodeSettings.max_concurrent_pulls={self.max_concurrent_pulls!r} is invalid; allowed: >= 1"
            )

    def wall_seconds(self, modelled_seconds: float) -> float:
        return modelled_seconds * self.time_scale

    def clock(self, start_wall: float) -> "RunClock":
        return RunClock.from_wall_start(start_wall)
