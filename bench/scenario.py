"""Scenario files: YAML, validated once at load.

A scenario names a cluster (topology, engine settings, links), a workload
(synthetic or a trace), the runtime, a set of variants to compare side by
side, repeats and seeds, and thresholds that turn the run into a regression
test. Every error names the field, the bad value and what is allowed.

    name: cascade
    runtime: inproc            # or ray
    cluster: {...}             # cluster.spec.ClusterSpec
    workload: {...}            # bench.workloads.WorkloadSpec
    # or: trace: {path: t.jsonl, format: auto, time_scale: 1.0, max_requests: 1000}
    variants:                  # a list ...
      - {name: fixed, set: {cluster.decode.engine.preemption_guard: fixed}}
    # ... or a matrix, crossed in order: names join with "+"
    #   matrix: {guard: {prefix: {...}, fixed: {...}}, delay: {d0: {...}, d20: {...}}}
    repeats: 3
    seed: 0                    # repeat r uses seed + r
    thresholds: ["num_zero_progress_preemptions[fixed] == 0"]
    report: {baseline: fixed, metrics: [num_preemptions, ...]}
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest

from .compare import Ref, ThresholdError, parse_threshold
from .traces import TraceError, load_trace
from .workloads import WorkloadSpecError, generate_workload, parse_workload_spec
from .workloads.spec import format_validation_error

# Ready scenarios ship in the repository's scenarios/ folder.
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "scenarios"

DEFAULT_METRICS = [
    "num_preemptions",
    "num_zero_progress_preemptions",
    "kv_corruptions_detected",
    "median_ttft_ms",
    "p99_ttft_ms",
    "output_throughput",
]


class ScenarioError(ValueError):
    """A scenario that does not load; the message says where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TraceSource(_Strict):
    path: str
    format: Literal["auto", "mooncake", "csv"] = "auto"
    time_scale: float = Field(1.0, gt=0)
    max_requests: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1)


class Variant(_Strict):
    name: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)


class Report(_Strict):
    baseline: str | None = None
    metrics: list[str] = Field(default_factory=lambda: list(DEFAULT_METRICS))
    percentiles: list[float] = Field(default_factory=lambda: [50.0, 90.0, 99.0])
    plots: bool = True
    include_requests: bool = False


class ScenarioFile(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    runtime: Literal["inproc", "ray"] = "inproc"
    cluster: dict[str, Any] = Field(default_factory=dict)
    workload: dict[str, Any] | None = None
    trace: TraceSource | None = None
    variants: list[Variant] | None = None
    matrix: dict[str, dict[str, dict[str, Any]]] | None = None
    repeats: int = Field(1, ge=1)
    seed: int = 0
    thresholds: list[str] = Field(default_factory=list)
    report: Report = Field(default_factory=Report)
    # Fault injection, each {kill: node-name, at: seconds}.
    faults: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_workload_source(self) -> ScenarioFile:
        if (self.workload is None) == (self.trace is None):
            raise ValueError("give exactly one of 'workload' (synthetic) or 'trace' (replay)")
        if self.variants is not None and self.matrix is not None:
            raise ValueError("give 'variants' (a list) or 'matrix' (crossed axes), not both")
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


class Scenario:
    """A loaded, fully validated scenario."""

    def __init__(self, raw: dict, source: str) -> None:
        self.source = source
        try:
            self.file = ScenarioFile.model_validate(raw)
        except ValidationError as exc:
            raise ScenarioError(format_validation_error(exc, ScenarioFile, f"scenario {source}")) from None
        self.raw = raw
        self.name = self.file.name
        self.variants = self._expand_variants()
        # Validate every variant's cluster and workload now, not mid-run.
        self._clusters = {v.name: self._cluster_for(v) for v in self.variants}
        for v in self.variants:
            self._workload_spec_for(v)
        self._check_thresholds()
        if self.file.report.baseline and self.file.report.baseline not in self._clusters:
            raise ScenarioError(
                f"scenario {source}: report.baseline={self.file.report.baseline!r} is not a variant; "
                f"allowed: {sorted(self._clusters)}"
            )

    def _check_thresholds(self) -> None:
        """Thresholds parse, and every variant they name exists."""
        for text in self.file.thresholds:
            try:
                tree = parse_threshold(text)
            except ThresholdError as exc:
                raise ScenarioError(f"scenario {self.source}: thresholds: {exc}") from None
            for ref in _refs(tree):
                if ref.variant not in self._clusters:
                    raise ScenarioError(
                        f"scenario {self.source}: threshold {text!r} names variant {ref.variant!r}; "
                        f"allowed: {sorted(self._clusters)}"
                    )

    # -- variants --------------------------------------------------------------
    def _expand_variants(self) -> list[Variant]:
        f = self.file
        if f.variants:
            return list(f.variants)
        if f.matrix:
            axes = [[(label, sets) for label, sets in axis.items()] for axis in f.matrix.values()]
            for name, axis in zip(f.matrix, axes):
                if not axis:
                    raise ScenarioError(f"scenario {self.source}: matrix.{name} has no values")
            out = []
            for combo in itertools.product(*axes):
                merged: dict[str, Any] = {}
                for _, sets in combo:
                    merged.update(sets)
                out.append(Variant(name="+".join(label for label, _ in combo), set=merged))
            return out
        return [Variant(name="default")]

    def _variant_raw(self, variant: Variant) -> dict:
        raw = copy.deepcopy(self.raw)
        for key, value in variant.set.items():
            set_dotted(raw, key, value, where=f"variant {variant.name!r}")
        return raw

    def _cluster_for(self, variant: Variant) -> ClusterSpec:
        raw = self._variant_raw(variant)
        try:
            return ClusterSpec.model_validate(raw.get("cluster") or {})
        except ValidationError as exc:
            raise ScenarioError(
                format_validation_error(exc, ClusterSpec, f"scenario {self.source}, variant {variant.name!r}: cluster")
            ) from None

    def _workload_spec_for(self, variant: Variant):
        raw = self._variant_raw(variant)
        if raw.get("workload") is None:
            return None
        try:
            return parse_workload_spec(
                raw["workload"], where=f"scenario {self.source}, variant {variant.name!r}: workload"
            )
        except WorkloadSpecError as exc:
            raise ScenarioError(str(exc)) from None

    def cluster(self, variant: str) -> ClusterSpec:
        return self._clusters[variant]

    def workload(self, variant: str, seed: int) -> tuple[list[WorkloadRequest], int | None]:
        v = next(x for x in self.variants if x.name == variant)
        spec = self._workload_spec_for(v)
        if spec is not None:
            return generate_workload(spec, seed=seed), spec.max_concurrency
        t = self.file.trace
        path = Path(t.path)
        if not path.is_absolute():
            path = Path(self.source).parent / path
        try:
            return load_trace(path, t.format, t.time_scale, t.max_requests), t.max_concurrency
        except TraceError as exc:
            raise ScenarioError(f"scenario {self.source}: trace: {exc}") from None

    @property
    def variant_names(self) -> list[str]:
        return [v.name for v in self.variants]

    def with_overrides(self, overrides: dict[str, Any]) -> Scenario:
        raw = copy.deepcopy(self.raw)
        for key, value in overrides.items():
            set_dotted(raw, key, value, where="--set")
        return Scenario(raw, self.source)


def _refs(tree):
    """Every metric[variant] reference in a parsed threshold."""
    if isinstance(tree, Ref):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for part in tree:
            yield from _refs(part)


def set_dotted(raw: dict, key: str, value: Any, where: str) -> None:
    """Set `a.b.c` in nested dicts, creating levels as needed."""
    parts = key.split(".")
    if not all(parts):
        raise ScenarioError(f"{where}: {key!r} is not a dotted path like cluster.decode.engine.num_gpu_blocks")
    node = raw
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise ScenarioError(f"{where}: cannot set {key!r}: {p!r} holds {type(nxt).__name__}, not a mapping")
        node = nxt
    node[parts[-1]] = value


def load_scenario(path: str | Path) -> Scenario:
    """Load a scenario file, or a built-in one by name (e.g. `cascade`)."""
    p = Path(path)
    if not p.exists():
        builtin = BUILTIN_DIR / f"{path}.yaml"
        if builtin.exists():
            p = builtin
        else:
            names = sorted(x.stem for x in BUILTIN_DIR.glob("*.yaml"))
            raise ScenarioError(
                f"scenario {str(path)!r} not found: not a file, and not a built-in ({', '.join(names)})"
            )
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario {p}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"scenario {p}: the top level must be a mapping, got {type(raw).__name__}")
    return Scenario(raw, str(p))


def builtin_scenarios() -> list[str]:
    return sorted(x.stem for x in BUILTIN_DIR.glob("*.yaml"))
