"""What a node needs besides its `NodeSpec`, whichever runtime runs it:
how step time maps to run time, the synthetic KV payload size, and the KV
fault policy. Plain data: it pickles into a Ray actor. Its settings are
declared here (engine/setting.py) and validated by the scenario schema
(`ClusterSpec`); a `NodeSettings` checks nothing again."""

from __future__ import annotations

from dataclasses import dataclass, field

from connector.kv_timing import NO_KV_TIMING, KVTransferTiming
from connector.pull_policy import KVFaultPolicy
from engine.cost_model import StepCostModel
from engine.setting import setting


@dataclass(frozen=True)
class NodeSettings:
    cost_model: StepCostModel
    # Run seconds per modelled second of step time: 1 on the virtual clock;
    # on the wall clock, wall seconds slept per modelled second.
    time_scale: float = setting(
        1.0, doc="Ray runtime only: wall seconds slept per modelled second of step time.", ge=1e-4, le=1e4
    )
    bytes_per_token: int = setting(
        64,
        doc="KV payload per token (bytes): small by default; 131072 B is an 8B-class model in fp16 "
        '(2 x 32 layers x 8 KV heads x 128 dims x 2 bytes). An int in [1, 16 MiB], or "auto": the cost '
        "model's K/V bytes per token (needs a roofline cost model).",
        ge=1,
        le=16 * 2**20,
    )
    kv_policy: KVFaultPolicy = field(default_factory=KVFaultPolicy)
    # The key a producer derives its per-request KV tickets from
    # (`node.access`): random per run on Ray, from the seed in-process.
    # Never logged: repr leaves it out.
    ticket_key: bytes = field(default=b"", repr=False)
    # What the KV connector spends beyond the link (connector/kv_timing.py): a decode node's transport applies it.
    kv_timing: KVTransferTiming = NO_KV_TIMING

    def run_seconds(self, modelled_seconds: float) -> float:
        return modelled_seconds * self.time_scale
