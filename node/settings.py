"""What a node needs besides its `NodeSpec`, whichever runtime runs it:
how step time maps to run time, the synthetic KV payload size, and the KV
fault policy. Plain data: it pickles into a Ray actor."""

from __future__ import annotations

from dataclasses import dataclass, field

from connector.kv_timing import NO_KV_TIMING, KVTransferTiming
from connector.pull_policy import KVFaultPolicy
from engine.cost_model import StepCostModel


@dataclass(frozen=True)
class NodeSettings:
    cost_model: StepCostModel
    # Run seconds per modelled second of step time: 1 on the virtual clock;
    # on the wall clock, wall seconds slept per modelled second.
    time_scale: float = 1.0
    # KV payload per token (bytes) of the synthetic blocks.
    bytes_per_token: int = 64
    kv_policy: KVFaultPolicy = field(default_factory=KVFaultPolicy)
    # The key a producer derives its per-request KV tickets from
    # (`node.access`): random per run on Ray, from the seed in-process.
    # Never logged: repr leaves it out.
    ticket_key: bytes = field(default=b"", repr=False)
    # What the KV connector spends beyond the link (connector/kv_timing.py): a decode node's transport applies it.
    kv_timing: KVTransferTiming = NO_KV_TIMING

    def __post_init__(self) -> None:
        if isinstance(self.time_scale, bool) or not (isinstance(self.time_scale, (int, float)) and self.time_scale > 0):
            raise ValueError(f"NodeSettings.time_scale={self.time_scale!r} is invalid; allowed: a number > 0")
        if (
            isinstance(self.bytes_per_token, bool)
            or not isinstance(self.bytes_per_token, int)
            or (self.bytes_per_token < 1)
        ):
            raise ValueError(f"NodeSettings.bytes_per_token={self.bytes_per_token!r} is invalid; allowed: an int >= 1")

    def run_seconds(self, modelled_seconds: float) -> float:
        return modelled_seconds * self.time_scale
