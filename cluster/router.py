"""Request routing policies of the proxy: round-robin and least-loaded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

ROUTING_POLICIES = ("round_robin", "least_loaded")


class Router(Generic[T]):
    def __init__(self, nodes: Sequence[T], policy: str, load: Callable[[T], float]) -> None:
        if not nodes:
            raise ValueError("a router needs at least one node")
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing policy {policy!r} is unknown; allowed: {', '.join(ROUTING_POLICIES)}")
        self.nodes = list(nodes)
        self.policy = policy
        self.load = load
        self._next = 0

    def pick(self) -> T:
        if self.policy == "round_robin" or len(self.nodes) == 1:
            node = self.nodes[self._next % len(self.nodes)]
            self._next += 1
            return node
        # Least loaded; ties go to the earliest node for determinism.
        return min(self.nodes, key=self.load)
