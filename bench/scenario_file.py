"""The scenario document's schema: every key a scenario file may have, its
type, default, allowed values and limits (pydantic models, validated once at
load). `bench/scenario.py` loads a file into these and resolves it;
`bench/schema_doc.py` turns them into docs/scenario-reference.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cluster.chaos import ChaosConfig
from cluster.settings_base import MAX_RUN_S, MAX_SEED, from_setting, settings_for

from .errors import InputError
from .workloads.spec import MAX_REQUESTS

DEFAULT_METRICS = [
    "num_preemptions",
    "num_zero_progress_preemptions",
    "kv_corruptions_detected",
    "median_ttft_ms",
    "p99_ttft_ms",
    "output_throughput",
]
# A scenario name becomes a directory under results/ and part of every file
# name: a plain name only (no path separators, no leading dot).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
# Variant names also appear in thresholds (`metric[variant]`) and file names;
# `+` joins matrix labels.
VARIANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$"
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
MAX_VARIANTS = 1000
MAX_REPEATS = 1000
MAX_THRESHOLDS = 1000
MAX_SCENARIO_BYTES = 4 * 2**20


class ScenarioError(InputError):
    """A scenario that does not load; the message says where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TraceSource(_Strict):
    """Replay a recorded trace instead of a synthetic workload (bench/traces.py)."""

    # Relative to the scenario file.
    path: str = Field(min_length=1, max_length=4096)
    format: Literal["auto", "mooncake", "csv"] = "auto"
    # Multiplies every arrival time: 0.5 replays twice as fast.
    time_scale: float = Field(1.0, gt=0, le=1e6)
    max_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    max_concurrency: int | None = Field(None, ge=1, le=MAX_REQUESTS)


class Variant(_Strict):
    name: str = Field(pattern=VARIANT_PATTERN)
    # Dotted keys into this document, e.g. {cluster.decode.engine.preemption_guard: fixed}.
    set: dict[str, Any] = Field(default_factory=dict)


class Fault(_Strict):
    """Kill a node at a run time (run seconds: virtual in-process, wall on Ray),
    or restart one killed before as a fresh process (empty pool and cache)."""

    kill: str | None = Field(None, min_length=1, max_length=100)
    restart: str | None = Field(None, min_length=1, max_length=100)
    at: float = Field(ge=0, le=MAX_RUN_S)

    @model_validator(mode="after")
    def _one_kind(self) -> Fault:
        if (self.kill is None) == (self.restart is None):
            raise ValueError(
                "a fault names one node as kill or restart; "
                "allowed: {kill: <node>, at: <s>} or {restart: <node>, at: <s>}"
            )
        return self

    @property
    def kind(self) -> str:
        return "kill" if self.kill is not None else "restart"

    @property
    def node(self) -> str:
        node = self.kill if self.kill is not None else self.restart
        assert node is not None  # _one_kind
        return node


class Chaos(_Strict):
    """Seeded random faults over a run (cluster/chaos.py): in-process every
    kind (kills, restarts, KV partitions, loss bursts, slow stages); on Ray the
    kills and restarts (the other kinds are in-process only)."""

    seed: int = from_setting(ChaosConfig, "seed")
    start_s: float = from_setting(ChaosConfig, "start_s")
    end_s: float = from_setting(ChaosConfig, "end_s")
    kills: int = from_setting(ChaosConfig, "kills")
    partitions: int = from_setting(ChaosConfig, "partitions")
    loss_bursts: int = from_setting(ChaosConfig, "loss_bursts")
    slow_stages: int = from_setting(ChaosConfig, "slow_stages")
    max_fault_s: float = from_setting(ChaosConfig, "max_fault_s")
    burst_loss: float = from_setting(ChaosConfig, "burst_loss")
    slow_factor: float = from_setting(ChaosConfig, "slow_factor")
    restarts: int = from_setting(ChaosConfig, "restarts")
    restart_after_s: float = from_setting(ChaosConfig, "restart_after_s")

    def config(self, repeat: int = 0) -> ChaosConfig:
        """The plan's settings for repeat `repeat`, which draws its own faults (seed + repeat)."""
        return ChaosConfig(**{**settings_for(ChaosConfig, self), "seed": self.seed + repeat})

    @model_validator(mode="after")
    def _window(self) -> Chaos:
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s={self.end_s:g} is invalid; allowed: > start_s ({self.start_s:g})")
        return self


class SLO(_Strict):
    """Latency targets a request must meet to count in `request_goodput` (vLLM's `--goodput`)."""

    ttft_ms: float | None = Field(None, gt=0, le=3_600_000)
    tpot_ms: float | None = Field(None, gt=0, le=3_600_000)
    e2el_ms: float | None = Field(None, gt=0, le=3_600_000)

    @model_validator(mode="after")
    def _one_target_at_least(self) -> SLO:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None:
            raise ValueError("an slo needs a target; allowed: ttft_ms, tpot_ms and/or e2el_ms")
        return self

    def targets_s(self) -> dict[str, float]:
        """The targets set, in seconds, by metric (ttft, tpot, e2el)."""
        ms = {"ttft": self.ttft_ms, "tpot": self.tpot_ms, "e2el": self.e2el_ms}
        return {k: v / 1000 for k, v in ms.items() if v is not None}


class Best(_Strict):
    """The variant the report names best: the highest (`goal: max`) or lowest mean of a metric."""

    metric: str = Field(min_length=1, max_length=200)
    goal: Literal["max", "min"] = "max"


class Report(_Strict):
    # The variant others are compared with (ratio of means); default: the first.
    baseline: str | None = None
    # The table's rows; `completed` and `failed` are always shown.
    metrics: list[str] = Field(default_factory=lambda: list(DEFAULT_METRICS), max_length=200)
    # Latency percentiles computed for TTFT, TPOT, ITL, E2EL (keys p<P>_<metric>_ms).
    percentiles: list[float] = Field(default_factory=lambda: [50.0, 90.0, 99.0], min_length=1, max_length=20)
    # PNG plots and report.html in the results directory.
    plots: bool = True
    # Per-request detail (latencies, finish reason) in every results JSON.
    include_requests: bool = False
    # Latency targets: results get request_goodput (req/s meeting all) and slo_attainment_pct.
    slo: SLO | None = None
    # Name the best variant by a metric's mean over repeats (e.g. {metric: request_goodput}).
    best: Best | None = None
    # In-process only: fold each finished request into the metrics and drop it, and keep no
    # step records, so a fleet of 10^5-10^6 requests runs in bounded memory (docs/fleet.md).
    # The results then hold the serving metrics and node counters, without per-request
    # detail, step aggregates, steps.jsonl or the per-request and per-step plots.
    stream_records: bool = False

    @model_validator(mode="after")
    def _streamed_records_are_gone(self) -> Report:
        if self.stream_records and (self.include_requests or self.slo is not None):
            taken = "include_requests" if self.include_requests else "slo"
            raise ValueError(
                f"stream_records drops each request's record once folded into the metrics, and {taken} needs "
                f"them; allowed: stream_records with include_requests false and no slo"
            )
        return self

    @field_validator("percentiles")
    @classmethod
    def _percentiles(cls, v: list[float]) -> list[float]:
        for p in v:
            if not 0 < p <= 100:
                raise ValueError(f"percentile {p:g} is invalid; allowed: 0 < p <= 100")
        if len(set(v)) != len(v):
            raise ValueError(f"percentiles {v} repeat a value; allowed: distinct values")
        return v


class ScenarioFile(_Strict):
    # A plain name: the results directory is results/<name>-<time>.
    name: str = Field(pattern=NAME_PATTERN)
    # Printed before the run; its first line is listed by `disagg-sim scenarios`.
    description: str = Field("", max_length=20_000)
    # inproc: one process, virtual clock, deterministic; ray: Ray actors, wall clock, gRPC.
    runtime: Literal["inproc", "ray"] = "inproc"
    # The topology and settings (see Cluster below).
    cluster: dict[str, Any] = Field(default_factory=dict)
    # A synthetic workload (see Synthetic workload); exactly one of workload / trace.
    workload: dict[str, Any] | None = None
    # A recorded trace to replay (see Trace replay); exactly one of workload / trace.
    trace: TraceSource | None = None
    # Variants compared side by side, each a name and the settings it changes; default: one variant "default".
    variants: list[Variant] | None = Field(None, min_length=1, max_length=MAX_VARIANTS)
    # Or crossed axes: {axis: {label: {dotted.key: value}}}; names join with "+"; at most 1,000 variants.
    matrix: dict[str, dict[str, dict[str, Any]]] | None = Field(None, min_length=1)
    # Runs per variant; the table shows mean ± std over them.
    repeats: int = Field(1, ge=1, le=MAX_REPEATS)
    # Repeat r runs with seed + r (workload, sampler and link streams).
    seed: int = Field(0, ge=0, le=MAX_SEED)
    # Expressions like "num_preemptions[prefix] / num_preemptions[fixed] >= 5" (bench/thresholds.py);
    # any failing one makes `run` exit 1.
    thresholds: list[str] = Field(default_factory=list, max_length=MAX_THRESHOLDS)
    # What the table, plots and results files show (see Report).
    report: Report = Field(default_factory=Report)
    # Fault injection: [{kill: decode-0, at: 2.5}, ...].
    faults: list[Fault] = Field(default_factory=list, max_length=1000)
    # Seeded random faults (see Chaos); the results carry the chaos report.
    chaos: Chaos | None = None

    @model_validator(mode="after")
    def _one_workload_source(self) -> ScenarioFile:
        if (self.workload is None) == (self.trace is None):
            raise ValueError("give exactly one of 'workload' (synthetic) or 'trace' (replay)")
        if self.variants is not None and self.matrix is not None:
            raise ValueError("give 'variants' (a list) or 'matrix' (crossed axes), not both")
        if self.seed + self.repeats - 1 > MAX_SEED:
            raise ValueError(f"seed + repeats - 1 = {self.seed + self.repeats - 1} is invalid; allowed: <= {MAX_SEED}")
        return self

    @field_validator("variants")
    @classmethod
    def _unique_names(cls, v):
        if v is not None:
            names = [x.name for x in v]
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"variant names must be unique; repeated: {sorted(dup)}")
        return v

    @field_validator("matrix")
    @classmethod
    def _matrix_labels(cls, v):
        if v is None:
            return v
        import re

        size = 1
        for axis, labels in v.items():
            for word in (axis, *labels):
                if not re.match(LABEL_PATTERN, str(word)):
                    raise ValueError(
                        f"matrix name {word!r} is invalid; allowed: letters, digits, '.', '_', '-' "
                        "(labels join with '+' into variant names)"
                    )
            if not labels:
                raise ValueError(f"matrix.{axis} has no values")
            size *= len(labels)
        if size > MAX_VARIANTS:
            raise ValueError(
                f"the matrix expands to {size:,} variants; allowed: at most {MAX_VARIANTS} "
                f"({' x '.join(str(len(x)) for x in v.values())})"
            )
        return v
