"""What a run produces, whichever runtime ran it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from engine.records import RequestRecord, StepRecord


@dataclass
class RunResult:
    clock: str  # "virtual" or "wall"
    duration: float
    requests: list[RequestRecord]
    steps: list[StepRecord]
    node_counters: dict[str, dict]
    violations: list[dict] = field(default_factory=list)
    invariant_errors: list[str] = field(default_factory=list)
    trace: list[tuple] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def counters(self) -> dict[str, float]:
        """Counters summed over nodes (peaks take the max)."""
        return sum_counters(self.node_counters.values())

    def counters_for(self, role_prefix: str) -> dict[str, float]:
        """The same over the nodes whose name starts with `role_prefix`."""
        return sum_counters(c for name, c in self.node_counters.items() if name.startswith(role_prefix))


def sum_counters(per_node: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Counters are ints but for a few times (a Ray run's `killed_at_s`, say):
    float, to say so; other values (nested tables) are not summed."""
    total: dict[str, float] = {}
    for counters in per_node:
        for k, v in counters.items():
            if isinstance(v, (int, float)):
                total[k] = max(total.get(k, 0), v) if k.endswith("_peak") else total.get(k, 0) + v
    return total


def kv_pull_summary(node_counters: dict[str, dict]) -> dict[str, int]:
    """The KV pulls of a run over all its consumers (both runtimes report these)."""
    keys = {
        "started": "kv_pulls_started",
        "completed": "kv_pulls_completed",
        "failed": "kv_pulls_failed",
        "attempts": "kv_pull_attempts",
        "retries": "transport_retries",
        "blocks": "kv_blocks_pulled",
        "bytes": "kv_bytes_pulled",
    }
    return {k: sum(c.get(key, 0) for c in node_counters.values()) for k, key in keys.items()}
