"""Request routing policies of the proxy: round-robin, least-loaded, and
prefix-aware (the node most likely to hold the longest cached prefix of the
prompt, as KV-cache-aware routers such as llm-d's do).

The prefix-aware policy keeps its own index of which prompt blocks it sent
to which node — the proxy cannot look into a node's cache, in-process or on
Ray, so both runtimes route alike. The index is bounded per node (least
recently routed blocks forgotten first), roughly as a node's cache evicts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

ROUTING_POLICIES = ("round_robin", "least_loaded", "prefix_aware")


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


class Router(Generic[T]):
    def __init__(
        self,
        nodes: Sequence[T],
        policy: str,
        load: Callable[[T], float],
        prefix_index: PrefixIndex[T] | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("a router needs at least one node")
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing policy {policy!r} is unknown; allowed: {', '.join(ROUTING_POLICIES)}")
        self.nodes = list(nodes)
        self.policy = policy
        self.load = load
        # Shared by the routers a proxy rebuilds when a node dies.
        self.prefix_index = prefix_index if prefix_index is not None else PrefixIndex()
        self._next = 0

    def pick(self, prompt_hashes: Sequence[int] = ()) -> T:
        """The node for a request; `prompt_hashes` (its prompt's block
        hashes) matter to the prefix-aware policy only."""
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
        # Least loaded; ties go to the earliest node for determinism.
        return min(self.nodes, key=self.load)
