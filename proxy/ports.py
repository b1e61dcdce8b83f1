"""What a runtime gives the proxy, and the settings it routes by.

The proxy never sleeps, reads a clock or opens a connection itself: time
comes from `now`, messages to nodes leave through `send` (the runtime
carries them over its impaired proxy -> node link and, when one lands,
asks `Proxy.deliverable` which of them the node still gets), and what the
clients see goes to `client`. Implementations: `cluster/inproc/proxy_links.py`
(the virtual clock) and `cluster/wall/proxy_links.py` (the wall clock, the
Ray proxy actor)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from node.messages import ProxyMessage

from .client import ClientPort
from .routing import ScoreWeights
from .timeline import FrontEnd, NoFrontEnd, ProxyTimeline

# A prompt's block hashes for prefix-aware routing: (request id, prompt length, segments) -> hashes.
PromptHashes = Callable[[str, int, Sequence[tuple[int, int]]], list[int]]

# vLLM's `kv_transfer_params`: the connector's own free-form mapping, which the
# proxy carries from the prefill node's output to the decode node's request
# untouched (over msgpack on Ray); its values are the connector's business.
KVTransferParams = dict[str, Any]


class TraceLog(Protocol):
    """The run's event trace (`InProcCluster(trace=True)`): one event, its
    name first (\"arrive\", \"finish\", \"reroute\", ...), then the request id and
    what the event says of it (a node, a finish reason, a count, ...)."""

    def __call__(self, *event: str | int | bool) -> None: ...


@dataclass(frozen=True)
class ProxySettings:
    prefill: tuple[str, ...]  # prefill node names; none: every request goes straight to a decode node
    decode: tuple[str, ...]
    routing: str  # the policy of both pools unless a pool says (proxy/routing.py)
    ignore_eos: bool  # the cluster's sampler setting, for requests that do not say
    prompt_hashes: PromptHashes
    block_size: int  # the decode pool's KV block size (tokens), for the kv_aware policy's usage estimate
    # A pool's own policy ({"prefill": ..., "decode": ...}); a pool not named: `routing`.
    pool_routing: Mapping[str, str] = field(default_factory=dict)
    # The kv_aware policy's weights, and what it estimates KV usage by: the
    # blocks of each pool's nodes.
    score_weights: ScoreWeights = ScoreWeights()
    pool_blocks: Mapping[str, int] = field(default_factory=dict)
    # The P/D hand-off's HTTP legs (proxy/timeline.py); all 0: none.
    timeline: ProxyTimeline = ProxyTimeline()
    # The API server's time (`engine/front_end.py`): requests on one queue, tokens on one per node.
    front_end: FrontEnd = NoFrontEnd()

    def policy(self, role: str) -> str:
        """The routing policy of the `role` pool."""
        return self.pool_routing.get(role, self.routing)


@dataclass(frozen=True)
class ProxyPorts:
    now: Callable[[], float]
    send: Callable[[str, ProxyMessage], None]
    client: ClientPort
    log: TraceLog | None = None
    # Run `fn` after `delay_s` run seconds (the runtime schedules it: an event
    # on the virtual clock, a timer on the wall clock's event loop). Needed
    # only when the timeline has a term that is not 0.
    call_later: Callable[[float, Callable[[], None]], None] | None = None
