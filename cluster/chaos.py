"""Chaos mode: a seeded plan of random faults over a run, and what the run
made of them. Pure: the plan is a list of `Fault`s drawn from a seed and the
node names; a runtime applies them (the in-process runtime:
`InProcCluster.inject`).

Fault kinds:
- `kill`: a node dies at `at` (never the last live node of its role);
- `restart`: a killed node comes back at `at` as a fresh process (empty
  pool and cache), and the proxy routes to it again;
- `partition`: the KV link between a decode and a prefill node drops every
  message in [at, at + duration);
- `loss_burst`: that link drops messages with probability `loss` in the window;
- `slow_stage`: a node's steps take `factor` times longer in the window.

The report: faults injected per kind, and whether the run survived them —
every request finished or failed with a reason (`requests_lost`: neither),
no block left held (`requests_leaked`: nodes' end-of-run errors), tokens
right.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.records import RequestRecord

FAULT_KINDS = ("kill", "restart", "partition", "loss_burst", "slow_stage")


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 0
    start_s: float = 0.0  # faults fall in [start_s, end_s)
    end_s: float = 5.0
    kills: int = 1
    partitions: int = 2
    loss_bursts: int = 2
    slow_stages: int = 2
    max_fault_s: float = 1.0  # longest partition / burst / slow window
    burst_loss: float = 0.5
    slow_factor: float = 4.0
    # How many of the killed nodes come back, each this long after its kill.
    restarts: int = 0
    restart_after_s: float = 0.5


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float
    target: str  # a node, or "decode-i>prefill-j" for a KV link
    duration: float = 0.0
    loss: float = 1.0
    factor: float = 1.0


def plan_faults(config: ChaosConfig, prefill: list[str], decode: list[str]) -> list[Fault]:
    """The run's faults, in time order; the same config and nodes give the same plan."""
    rng = random.Random(f"disagg-chaos/{config.seed}")
    span = config.end_s - config.start_s
    faults: list[Fault] = []

    def when() -> float:
        return config.start_s + rng.random() * span

    killable = {"prefill": list(prefill), "decode": list(decode)}
    for _ in range(config.kills):
        roles = [r for r, names in killable.items() if len(names) > 1]  # never the last of a role
        if not roles:
            break
        names = killable[rng.choice(sorted(roles))]
        faults.append(Fault("kill", when(), names.pop(rng.randrange(len(names)))))
    pairs = [f"{d}>{p}" for d in decode for p in prefill]
    if pairs:
        for _ in range(config.partitions):
            faults.append(Fault("partition", when(), rng.choice(pairs), rng.random() * config.max_fault_s))
        for _ in range(config.loss_bursts):
            d = rng.random() * config.max_fault_s
            faults.append(Fault("loss_burst", when(), rng.choice(pairs), d, loss=config.burst_loss))
    nodes = list(prefill) + list(decode)
    for _ in range(config.slow_stages):
        d = rng.random() * config.max_fault_s
        faults.append(Fault("slow_stage", when(), rng.choice(nodes), d, factor=config.slow_factor))
    # Drawn last, so a plan without restarts is the plan it always was.
    kills = [f for f in faults if f.kind == "kill"]
    for kill in rng.sample(kills, min(config.restarts, len(kills))):
        faults.append(Fault("restart", kill.at + config.restart_after_s, kill.target))
    return sorted(faults, key=lambda f: (f.at, f.kind, f.target))


@dataclass
class ChaosReport:
    injected: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    requests_finished: int = 0
    requests_failed: int = 0  # finished with "error", each with its reason
    requests_lost: int = 0  # neither finished nor failed at the end
    requests_leaked: int = 0  # node end-of-run errors: blocks held, not conserved
    invariant_errors: int = 0

    @property
    def survived(self) -> bool:
        return self.requests_lost == 0 and self.requests_leaked == 0 and self.invariant_errors == 0

    def to_dict(self) -> dict:
        return {
            "injected": dict(sorted(self.injected.items())),
            "faults_injected": sum(self.injected.values()),
            "faults_survived": sum(self.injected.values()) if self.survived else 0,
            "survived": self.survived,
            "requests": self.requests,
            "requests_finished": self.requests_finished,
            "requests_failed": self.requests_failed,
            "requests_lost": self.requests_lost,
            "requests_leaked": self.requests_leaked,
            "invariant_errors": self.invariant_errors,
        }


def chaos_report(
    faults: list[Fault], requests: Sequence[RequestRecord], invariant_errors: list[str], node_errors: int
) -> ChaosReport:
    report = ChaosReport()
    for f in faults:
        report.injected[f.kind] = report.injected.get(f.kind, 0) + 1
    report.requests = len(requests)
    report.requests_lost = sum(r.finish_reason is None for r in requests)
    report.requests_failed = sum(r.finish_reason == "error" for r in requests)
    report.requests_finished = report.requests - report.requests_lost - report.requests_failed
    report.requests_leaked = node_errors
    report.invariant_errors = len(invariant_errors)
    return report
