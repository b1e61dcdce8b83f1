"""What a run produces, whichever runtime ran it."""

from __future__ import annotations

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

    def counters(self) -> dict[str, int]:
        """Counters summed over nodes."""
        total: dict[str, int] = {}
        for counters in self.node_counters.values():
            for k, v in counters.items():
                if isinstance(v, (int, float)):
                    if k.endswith("_peak"):
                        total[k] = max(total.get(k, 0), v)
                    else:
                        total[k] = total.get(k, 0) + v
        return total

    def counters_for(self, role_prefix: str) -> dict[str, int]:
        sub = RunResult(self.clock, self.duration, [], [], {k: v for k, v in self.node_counters.items() if k.startswith(role_prefix)})
        return sub.counters()
