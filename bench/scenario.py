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
from typing import Any

import yaml
from pydantic import ValidationError

from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest

from .errors import did_you_mean, format_validation_error, one_line
from .input_files import read_regular_text
from .scenario_checks import check_capacity, check_faults, check_prompts_fit, check_report, check_thresholds
from .scenario_file import MAX_SCENARIO_BYTES, ScenarioError, ScenarioFile, Variant
from .traces import TraceError, load_trace, require_trace_file
from .workloads import generate_workload
from .workloads.spec import WorkloadSpec
from .yaml_source import find_control_characters, line_of, load_yaml_with_lines

# Ready scenarios ship in the repository's scenarios/ folder.
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "scenarios"


# The top-level keys a variant's `set` may change (each variant gets its own).
VARIANT_SETTABLE = ("cluster", "workload")


class Scenario:
    """A loaded, fully validated scenario.

    `raw` is the document as written (after `--set` overrides); `lines` maps
    its keys to lines of the file, for `file:line` in errors; `overrides` are
    the `--set` values applied, with `origins` naming the flag of each.
    """

    def __init__(
        self,
        raw: dict,
        source: str,
        lines: dict | None = None,
        overrides: dict[str, Any] | None = None,
        origins: dict[str, str] | None = None,
    ) -> None:
        self.source = source
        self.lines = lines or {}
        self.overrides = dict(overrides or {})
        self.origins = dict(origins or {})
        bad = find_control_characters(raw)
        if bad is not None:
            path, char = bad
            raise ScenarioError(
                f"{self._where(path)}: {_dotted(path) or '(top level)'} holds the control character {char!r}; "
                "allowed: printable text"
            )
        try:
            self.file = ScenarioFile.model_validate(raw, context=self._validation_context)
        except ValidationError as exc:
            raise ScenarioError(format_validation_error(exc, ScenarioFile, source, locate=self._where)) from None
        self.raw = raw
        self.name = self.file.name
        self.variants = self._expand_variants()
        self._check_variant_keys()
        self._check_overrides_vs_variants()
        # Validate every variant's cluster and workload now, not mid-run.
        self._clusters = {v.name: self._cluster_for(v) for v in self.variants}
        self._workload_specs = {v.name: self._workload_spec_for(v) for v in self.variants}
        self._trace_cache: list[WorkloadRequest] | None = None
        check_faults(self)
        check_capacity(self)
        check_prompts_fit(self)
        check_report(self)
        check_thresholds(self)

    @property
    def _validation_context(self) -> dict[str, Path]:
        # Relative file paths in the scenario (empirical lengths) are its directory's, as trace.path is.
        return {"base_dir": Path(self.source).parent.resolve()}

    # -- where an error points ------------------------------------------------------
    def _where(self, path: tuple, variant: Variant | None = None) -> str:
        """`file:line` of a document path; a `--set` or a variant's `set` entry when one wrote it."""
        dotted = _dotted(path)

        def hits(key: str) -> bool:
            return bool(dotted) and (dotted == key or dotted.startswith(key + ".") or key.startswith(dotted + "."))

        if variant is not None:
            for key in variant.set:
                if hits(key):
                    origin = self._variant_origin(variant, key)
                    return f"{origin} (variant {variant.name!r})"
        for key in self.overrides:
            if hits(key):
                return f"{self.origins.get(key, '--set ' + key)}"
        line = line_of(self.lines, tuple(path))
        return f"{self.source}:{line}" if line else self.source

    def _variant_origin(self, variant: Variant, key: str) -> str:
        f = self.file
        if f.variants:
            i = next(i for i, v in enumerate(f.variants) if v.name == variant.name)
            line = line_of(self.lines, ("variants", i, "set", key))
        else:
            line = None
            for axis, labels in (f.matrix or {}).items():
                for label, sets in labels.items():
                    if key in sets and label in variant.name.split("+"):
                        line = line_of(self.lines, ("matrix", axis, label, key))
        return f"{self.source}:{line}" if line else self.source

    def _fail(self, path: tuple, message: str, variant: Variant | None = None) -> ScenarioError:
        return ScenarioError(one_line(f"{self._where(path, variant)}: {message}"))

    # -- variants --------------------------------------------------------------
    def _expand_variants(self) -> list[Variant]:
        f = self.file
        if f.variants:
            return list(f.variants)
        if f.matrix:
            axes = [[(label, sets) for label, sets in axis.items()] for axis in f.matrix.values()]
            out = []
            for combo in itertools.product(*axes):
                merged: dict[str, Any] = {}
                for _, sets in combo:
                    merged.update(sets)
                out.append(Variant(name="+".join(label for label, _ in combo), set=merged))
            return out
        return [Variant(name="default")]

    def _check_variant_keys(self) -> None:
        """A variant differs from the others only in its cluster and workload
        (what `_cluster_for` / `_workload_spec_for` read); a `set` of any
        other key (`faults`, `seed`, `repeats`, ...) would be silently
        ignored (issue 34): refuse it."""
        for v in self.variants:
            for key in v.set:
                if key.split(".", 1)[0] not in VARIANT_SETTABLE:
                    raise ScenarioError(
                        f"{self._variant_origin(v, key)}: variant {v.name!r} sets {key!r}, which a variant cannot "
                        f"change; allowed: keys under {' or '.join(k + '.' for k in VARIANT_SETTABLE)} "
                        "(set the others at the top level)"
                    )

    def _check_overrides_vs_variants(self) -> None:
        """A `--set` that a variant sets too would be silently overridden by the variant: refuse it."""
        for key in self.overrides:
            for v in self.variants:
                for vkey in v.set:
                    if vkey == key or vkey.startswith(key + ".") or key.startswith(vkey + "."):
                        raise ScenarioError(
                            f"{self.origins.get(key, '--set ' + key)}: {key} is also set by variant {v.name!r} "
                            f"({self._variant_origin(v, vkey)}: {vkey}), which would override it; allowed: --set "
                            "keys no variant sets (edit the variants, or copy the scenario)"
                        )

    def _variant_raw(self, variant: Variant) -> dict:
        raw = copy.deepcopy(self.raw)
        for key, value in variant.set.items():
            set_dotted(raw, key, value, where=self._where(tuple(key.split(".")), variant))
        return raw

    def _cluster_for(self, variant: Variant) -> ClusterSpec:
        raw = self._variant_raw(variant)
        try:
            return ClusterSpec.model_validate(raw.get("cluster") or {}, context=self._validation_context)
        except ValidationError as exc:
            raise ScenarioError(
                format_validation_error(
                    exc, ClusterSpec, self.source, locate=lambda p: self._where(p, variant), prefix=("cluster",)
                )
            ) from None

    def _workload_spec_for(self, variant: Variant) -> WorkloadSpec | None:
        raw = self._variant_raw(variant)
        if raw.get("workload") is None:
            return None
        try:
            return WorkloadSpec.model_validate(raw["workload"], context=self._validation_context)
        except ValidationError as exc:
            raise ScenarioError(
                format_validation_error(
                    exc, WorkloadSpec, self.source, locate=lambda p: self._where(p, variant), prefix=("workload",)
                )
            ) from None

    def known_metrics(self) -> set[str]:
        """Every metric name this scenario's results will carry."""
        if getattr(self, "_known", None) is None:
            from .metric_names import known_metric_names

            report = self.file.report
            self._known = known_metric_names(self._clusters.values(), report.percentiles, report.slo is not None)
        return self._known

    # -- what the runner uses ---------------------------------------------------------
    def cluster(self, variant: str) -> ClusterSpec:
        return self._clusters[variant]

    def variant(self, name: str) -> Variant:
        return next(x for x in self.variants if x.name == name)

    def workload_spec(self, variant: str) -> WorkloadSpec | None:
        """The variant's generated workload (None: it replays a trace)."""
        return self._workload_specs[variant]

    def workload(self, variant: str, seed: int) -> tuple[list[WorkloadRequest], int | None]:
        spec = self._workload_specs[variant]
        if spec is not None:
            return generate_workload(spec, seed=seed), spec.max_concurrency
        t = self.file.trace
        assert t is not None  # one of workload / trace, checked at load
        if self._trace_cache is None:
            try:
                path = require_trace_file(t.path, self.source)
                self._trace_cache = load_trace(path, t.format, t.time_scale, t.max_requests)
            except TraceError as exc:
                raise self._fail(("trace", "path"), f"trace: {exc}") from None
        return list(self._trace_cache), t.max_concurrency

    def trace_path(self) -> Path:
        t = self.file.trace
        assert t is not None
        path = Path(t.path)
        return path if path.is_absolute() else Path(self.source).parent / path

    @property
    def variant_names(self) -> list[str]:
        return [v.name for v in self.variants]

    def with_overrides(self, overrides: dict[str, Any], origins: dict[str, str] | None = None) -> Scenario:
        """The scenario with dotted-key overrides applied (`--set`; `origins` names the flag of each)."""
        origins = {**self.origins, **(origins or {})}
        raw = copy.deepcopy(self.raw)
        for key, value in overrides.items():
            set_dotted(raw, key, value, where=origins.get(key, f"--set {key}"))
        return Scenario(raw, self.source, self.lines, {**self.overrides, **overrides}, origins)


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def set_dotted(raw: dict, key: str, value: Any, where: str) -> None:
    """Set `a.b.c` in nested dicts, creating levels as needed."""
    parts = key.split(".")
    if not isinstance(key, str) or not all(parts):
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
    text_path = str(path)
    if "\x00" in text_path:
        raise ScenarioError(
            f"scenario {text_path!r}: the path holds a NUL byte; allowed: a file path or a built-in name"
        )
    p = Path(path)
    if not p.exists():
        builtin = BUILTIN_DIR / f"{path}.yaml"
        if "/" not in text_path and builtin.exists():
            p = builtin
        else:
            names = builtin_scenarios()
            raise ScenarioError(
                f"scenario {text_path!r} not found: not a file, and not a built-in"
                f"{did_you_mean(text_path, names)} (built-ins: {', '.join(names)})"
            )
    if p.is_dir():
        raise ScenarioError(f"scenario {p}: is a directory; allowed: a scenario file (.yaml) or a built-in name")
    try:
        text = read_regular_text(p, MAX_SCENARIO_BYTES, "scenario")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"scenario {p}: not a text file (byte {exc.start} is not UTF-8)") from None
    except OSError as exc:
        raise ScenarioError(f"scenario {p}: cannot read ({exc.strerror or exc})") from None
    try:
        raw, lines = load_yaml_with_lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(one_line(f"{where}: not valid YAML: {problem}")) from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{p}: the top level must be a mapping (name: ..., cluster: ...), got {type(raw).__name__}")
    return Scenario(raw, str(p), lines)


def builtin_scenarios() -> list[str]:
    return sorted(x.stem for x in BUILTIN_DIR.glob("*.yaml"))
