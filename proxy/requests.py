"""A request as the proxy follows it: where it is routed, in which phase,
how many of its tokens the client has, and which prefill node holds its
prompt's blocks until a decode node has pulled them."""

from __future__ import annotations

from dataclasses import dataclass, field

from .client import Submission


@dataclass(slots=True)
class ProxiedRequest:
    request_id: str
    prompt_len: int
    output_len: int
    priority: int
    arrival: float
    prompt_segments: tuple[tuple[int, int], ...] = ()
    ignore_eos: bool | None = None  # None: the cluster's sampler setting
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    node: str = ""  # the node it is routed to ("" before routing)
    phase: str = "prefill"  # "prefill" | "decode"
    done: bool = False
    sched_sent: bool = False  # the client has its first scheduled time
    counted: bool = False  # included in the proxy's outstanding count of `node`
    blocks: int = 0  # its prompt's blocks, counted in the proxy's active blocks of `node` while `counted`
    prefill_node: str = ""  # holds the prompt's blocks until the decode node pulls them
    delivered: int = 0  # tokens sent to the client
    # When the client saw its last token: a stream re-routed from a node whose
    # API server was behind never shows a later token earlier than that.
    seen: float = 0.0
    # When each part of its TTFT ended (proxy/breakdown.py), until its first token.
    marks: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, item: Submission, arrival: float) -> ProxiedRequest:
        return cls(
            item.request_id,
            item.prompt_len,
            item.output_len,
            item.priority,
            arrival,
            tuple(item.prompt_segments),
            item.ignore_eos,
            item.min_tokens,
            tuple(item.stop_token_ids),
        )
