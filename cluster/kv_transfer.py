"""`cluster.kv_transfer`: which P/D hand-off the cluster runs (a connector
preset, then any term overridden), turned into the proxy's `ProxyTimeline`
and the connector's `KVTransferTiming` (docs/cost-model.md, "The P/D
hand-off", has every number's source).

    kv_transfer: {preset: nixl}                      # vLLM's NixlConnector behind its disagg proxy
    kv_transfer: {preset: nixl, handshake_s: 0}      # a warm cluster: peers already met
    kv_transfer: {preset: mooncake, prefill_tp: 4, decode_tp: 2}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from connector.kv_timing import KVTransferTiming
from proxy.timeline import ProxyTimeline

from .settings_base import from_setting

# Each preset's terms (seconds unless named otherwise). Sources and the
# arithmetic: docs/cost-model.md, "The P/D hand-off".
PRESETS: dict[str, dict[str, float | None]] = {
    # No hand-off cost beyond the links: the simulator before the P/D timeline (22-34 % short
    # of published P/D TTFTs; docs/cost-model.md, "Which preset by default").
    "none": {
        "prefill_request_s": 0.0,
        "prefill_reply_s": 0.0,
        "decode_request_s": 0.0,
        "handshake_s": 0.0,
        "metadata_s": 0.0,
        "transfer_latency_s": 0.0,
        "descriptor_us": 0.0,
        "bandwidth_GBps": None,
    },
    # NixlConnector (vLLM >= 0.9, RFC #50913 / PR #51919 at v0.14; handshake: neuralmagic/vllm PR #63).
    "nixl": {
        "prefill_request_s": 0.002,
        "prefill_reply_s": 0.002,
        "decode_request_s": 0.002,
        "handshake_s": 2.0,
        "metadata_s": 0.001,
        "transfer_latency_s": 0.001,
        "descriptor_us": 3.9,
        "bandwidth_GBps": 25.0,
    },
    # MooncakeConnector (vLLM PR #24718): Mooncake's Transfer Engine over RDMA, one batch per request.
    "mooncake": {
        "prefill_request_s": 0.002,
        "prefill_reply_s": 0.002,
        "decode_request_s": 0.002,
        "handshake_s": 0.1,
        "metadata_s": 0.001,
        "transfer_latency_s": 0.002,
        "descriptor_us": 1.0,
        "bandwidth_GBps": 20.0,
    },
    # P2pNcclConnector (vLLM PR #18242: "~30ms overhead for 10000 tokens", Llama-3.1-8B on H100s).
    "p2pnccl": {
        "prefill_request_s": 0.002,
        "prefill_reply_s": 0.002,
        "decode_request_s": 0.002,
        "handshake_s": 0.7,
        "metadata_s": 0.001,
        "transfer_latency_s": 0.0,
        "descriptor_us": 0.0,
        "bandwidth_GBps": 44.0,
    },
}

Term = float | None


class KVTransferSettings(BaseModel):
    """The P/D hand-off: a preset (`nixl` by default, `none`, `mooncake`,
    `p2pnccl`) and any of its terms overridden. Times in modelled seconds (on
    Ray slept x `time_scale`). `nixl` by default because published P/D runs
    say a free hand-off is too short (docs/cost-model.md, "Which preset by
    default")."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # Every term below left null takes the preset's value (docs/cost-model.md, "The P/D hand-off").
    preset: Literal["none", "nixl", "mooncake", "p2pnccl"] = "nixl"
    # The proxy's legs (proxy/timeline.py) and the connector's terms (connector/kv_timing.py);
    # null: the preset's value.
    prefill_request_s: Term = from_setting(ProxyTimeline, "prefill_request_s", default=None)
    prefill_reply_s: Term = from_setting(ProxyTimeline, "prefill_reply_s", default=None)
    decode_request_s: Term = from_setting(ProxyTimeline, "decode_request_s", default=None)
    handshake_s: Term = from_setting(KVTransferTiming, "handshake_s", default=None)
    metadata_s: Term = from_setting(KVTransferTiming, "metadata_s", default=None)
    transfer_latency_s: Term = from_setting(KVTransferTiming, "transfer_latency_s", default=None)
    descriptor_us: Term = from_setting(KVTransferTiming, "descriptor_us", default=None)
    bandwidth_GBps: Term = from_setting(KVTransferTiming, "bandwidth_GBps", default=None)
    # Descriptors per block and layer: K and V. A decode rank that reads from
    # several prefill ranks (prefill_tp > decode_tp) makes that many reads per
    # block; null: the cost model's tp (the same layout on both sides).
    prefill_tp: int | None = Field(None, ge=1, le=1024)
    decode_tp: int | None = Field(None, ge=1, le=1024)
    # Layers whose K/V a block holds; null: the cost model's (32 for a linear set).
    num_layers: int | None = Field(None, ge=1, le=10_000)

    def term(self, name: str) -> Term:
        own = getattr(self, name)
        return own if own is not None else PRESETS[self.preset][name]

    def proxy_timeline(self) -> ProxyTimeline:
        return ProxyTimeline(
            prefill_request_s=self.term("prefill_request_s") or 0.0,
            prefill_reply_s=self.term("prefill_reply_s") or 0.0,
            decode_request_s=self.term("decode_request_s") or 0.0,
        )

    def timing(self, model_layers: int | None, model_tp: int) -> KVTransferTiming:
        """The connector's terms, with descriptors per block from the layers and TP layouts."""
        layers = self.num_layers or model_layers or 32
        prefill_tp = self.prefill_tp or model_tp
        decode_tp = self.decode_tp or model_tp
        fan_in = max(1, prefill_tp // decode_tp)
        return KVTransferTiming(
            name=self.preset,
            handshake_s=self.term("handshake_s") or 0.0,
            metadata_s=self.term("metadata_s") or 0.0,
            transfer_latency_s=self.term("transfer_latency_s") or 0.0,
            descriptor_us=self.term("descriptor_us") or 0.0,
            bandwidth_GBps=self.term("bandwidth_GBps"),
            descriptors_per_block=2 * layers * fan_in,
        )
