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
from engine.setting import MAX_RUN_S, MAX_SEED, setting

FAULT_KINDS = ("kill", "restart", "partition", "loss_burst", "slow_stage")


@dataclass(frozen=True)
class ChaosConfig:
    """A chaos plan's settings, declared here (engine/setting.py) and validated
    by the scenario schema (`chaos:`, bench/scenario_file.py)."""

    seed: int = setting(0, doc="Seeds the plan; repeat r of a scenario draws with seed + r.", ge=0, le=MAX_SEED)
    start_s: float = setting(0.0, doc="Faults fall in [start_s, end_s) run seconds.", ge=0, le=MAX_RUN_S)
    end_s: float = setting(5.0, doc="The end of the faults' window.", gt=0, le=MAX_RUN_S)
    kills: int = setting(1, doc="Nodes killed (never the last live node of its role).", ge=0, le=100)
    partitions: int = setting(2, doc="KV link partitions (in-process).", ge=0, le=1000)
    loss_bursts: int = setting(2, doc="KV link loss bursts (in-process).", ge=0, le=1000)
    slow_stages: int = setting(2, doc="Windows of slow steps on a node (in-process).", ge=0, le=1000)
    max_fault_s: float = setting(1.0, doc="The longest partition, burst or slow window.", gt=0, le=3600)
    burst_loss: float = setting(0.5, doc="A loss burst's drop probability.", gt=0, le=1)
    slow_factor: float = setting(4.0, doc="How many times longer a slow window's steps take.", ge=1, le=1000)
    restarts: int = setting(
        0, doc="How many killed nodes come back (a fresh process), each `restart_after_s` after its kill.", ge=0, le=100
    )
    restart_after_s: float = setting(0.5, doc="From a kill to its restart.", gt=0, le=MAX_RUN_S)


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
