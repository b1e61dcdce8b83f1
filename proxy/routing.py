"""Request routing policies of the proxy, per pool (prefill and decode
separately), as llm-d's inference scheduler and Dynamo's router offer them
(docs/fleet.md has what each does there and what is modelled here):

- `round_robin`: the pool's nodes in turn;
- `least_loaded`: the node with the fewest requests outstanding;
- `prefix_aware`: the node most likely to hold the longest cached prefix of
  the prompt (ties: the least loaded);
- `kv_aware`: a weighted sum of scores in [0, 1], highest wins, as llm-d's
  scorers are combined — prefix hits (matched blocks / prompt blocks, the
  prefix-cache scorer), queue depth (min-max normalised outstanding
  requests, the queue scorer) and KV usage (1 - estimated usage, the
  KV-cache-utilization scorer); weights configurable.

What the proxy knows of a node is what it routed there: the proxy cannot
look into a node's cache, in-process or on Ray, so both runtimes route
alike. Its prefix index is approximate, as llm-d's approximate
prefix-cache scorer and Dynamo's router without KV events are: the block
hashes of the prompts it sent each node, bounded per node (least recently
routed blocks forgotten first), roughly as a node's cache evicts. Its KV
usage is an estimate too, as Dynamo's active-block tracking is: the prompt
blocks of the requests outstanding at a node over the node's blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine.setting import setting

T = TypeVar("T", bound=Hashable)

ROUTING_POLICIES = ("round_robin", "least_loaded", "prefix_aware", "kv_aware")
# The policies that read a prompt's block hashes (and keep a prefix index).
PREFIX_POLICIES = frozenset({"prefix_aware", "kv_aware"})


@dataclass(frozen=True)
class ScoreWeights:
    """The `kv_aware` policy's weights. The defaults are llm-d's default
    scheduling profile (prefix-cache 3, queue 2) with its KV-cache-utilization
    scorer at the queue's weight (docs/fleet.md)."""

    prefix: float = setting(
        3.0, doc="The weight of a node's prefix-hit score (its share of the prompt's blocks it holds).", ge=0, le=1e6
    )
    queue: float = setting(
        2.0, doc="The weight of a node's queue-depth score (fewer outstanding requests score higher).", ge=0, le=1e6
    )
    kv_usage: float = setting(
        2.0, doc="The weight of a node's KV-usage score (a freer KV pool scores higher).", ge=0, le=1e6
    )


class PrefixIndex(Generic[T]):
    """Block hashes of the prompts routed to each node, most recent last."""

    def __init__(self, capacity_blocks: int = 200_000) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: dict[T, OrderedDict[int, None]] = {}

    def match(self, node: T, hashes: Sequence[int]) -> int:
        """How many leading blocks of the prompt the node was sent before."""
        held = self._blocks.get(node)
        if not held:
            return 0
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def record(self, node: T, hashes: Sequence[int]) -> None:
        held = self._blocks.setdefault(node, OrderedDict())
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.capacity_blocks:
            held.popitem(last=False)


def _no_kv_usage(node: object) -> float:
    return 0.0


class Router(Generic[T]):
    def __init__(
        self,
        nodes: Sequence[T],
        policy: str,
        load: Callable[[T], float],
        prefix_index: PrefixIndex[T] | None = None,
        kv_usage: Callable[[T], float] = _no_kv_usage,
        weights: ScoreWeights = ScoreWeights(),
    ) -> None:
        """`load`: a node's queue depth as the proxy knows it (requests
        outstanding); `kv_usage`: its estimated KV usage, a fraction of its
        blocks (read by `kv_aware` only)."""
        if not nodes:
            raise ValueError("a router needs at least one node")
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing policy {policy!r} is unknown; allowed: {', '.join(ROUTING_POLICIES)}")
        self.nodes = list(nodes)
        self.policy = policy
        self.load = load
        self.kv_usage = kv_usage
        self.weights = weights
        # Shared by the routers a proxy rebuilds when a node dies.
        self.prefix_index = prefix_index if prefix_index is not None else PrefixIndex()
        self._next = 0

    def pick(self, prompt_hashes: Sequence[int] = ()) -> T:
        """The node for a request; `prompt_hashes` (its prompt's block
        hashes) matter to the prefix-reading policies only."""
        if self.policy == "round_robin":
            node = self.nodes[self._next % len(self.nodes)]
            self._next += 1
            return node
        if self.policy == "prefix_aware":
            index = self.prefix_index
            # Longest known prefix; ties go to the least loaded, then the earliest node.
            node = max(self.nodes, key=lambda n: (index.match(n, prompt_hashes), -self.load(n)))
            index.record(node, prompt_hashes)
            return node
        if self.policy == "kv_aware":
            scores = self.scores(prompt_hashes)
            # Highest score; ties go to the earliest node (max keeps the first).
            node = self.nodes[max(range(len(scores)), key=scores.__getitem__)]
            self.prefix_index.record(node, prompt_hashes)
            return node
        # Least loaded; ties go to the earliest node for determinism.
        return min(self.nodes, key=self.load)

    def scores(self, prompt_hashes: Sequence[int]) -> list[float]:
        """The `kv_aware` score of each node, in node order: the weighted sum
        of its prefix, queue and KV-usage scores, each in [0, 1]."""
        w = self.weights
        total_blocks = len(prompt_hashes)
        loads = [self.load(n) for n in self.nodes]
        low, high = min(loads), max(loads)
        out = []
        for node, load in zip(self.nodes, loads, strict=True):
            prefix = self.prefix_index.match(node, prompt_hashes) / total_blocks if total_blocks else 0.0
            # Min-max normalised: the emptiest queue scores 1, the fullest 0; all alike score 1.
            queue = (high - load) / (high - low) if high > low else 1.0
            kv = 1.0 - min(1.0, max(0.0, self.kv_usage(node)))
            out.append(w.prefix * prefix + w.queue * queue + w.kv_usage * kv)
        return out
