"""The checks of a scenario that need the whole of it (its variants'
clusters and workloads together): faults name nodes every variant has,
each node's KV pool holds a max_model_len request, every prompt fits,
the report and the thresholds name variants, nodes and metrics that exist.
`Scenario.__init__` runs them at load, so a bad scenario fails before any
run; each error points at the file line, `--set` or variant that wrote the
value."""

from __future__ import annotations

import math
from typing import Any, Protocol

from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest

from .errors import did_you_mean
from .per_node import split_variant
from .scenario_file import ScenarioError, ScenarioFile, Variant
from .thresholds import Ref, ThresholdError, parse_threshold
from .workloads.spec import WorkloadSpec


class CheckedScenario(Protocol):
    """What the checks read of a scenario (`bench.scenario.Scenario`, which
    runs them at load)."""

    file: ScenarioFile
    variants: list[Variant]
    _clusters: dict[str, ClusterSpec]
    _workload_specs: dict[str, WorkloadSpec | None]

    def _fail(self, path: tuple, message: str, variant: Variant | None = None) -> ScenarioError: ...

    def workload(self, variant: str, seed: int) -> tuple[list[WorkloadRequest], int | None]: ...

    def known_metrics(self) -> set[str]: ...


def check_faults(sc: CheckedScenario) -> None:
    faults = sc.file.faults
    for i, fault in enumerate(faults):
        kind, node = fault.kind, fault.node
        for v in sc.variants:
            names = [ns.name for _, ns, _ in sc._clusters[v.name].node_specs()]
            if node not in names:
                raise sc._fail(
                    ("faults", i, kind),
                    f"faults[{i}].{kind}={node!r} names no node of variant {v.name!r}"
                    f"{did_you_mean(node, names)}; allowed: {', '.join(names)}",
                )
        if kind == "restart" and not any(f.kill == node and f.at < fault.at for f in faults):
            raise sc._fail(
                ("faults", i, kind),
                f"faults[{i}].restart={node!r} at {fault.at:g} s follows no kill of it; allowed: after its kill",
            )


def check_capacity(sc: CheckedScenario) -> None:
    """vLLM's start-up check: a node's KV pool holds at least one max_model_len request."""
    for v in sc.variants:
        spec = sc._clusters[v.name]
        for role, group in (("prefill", spec.prefill), ("decode", spec.decode)):
            e = group.engine
            if not group.count:
                continue
            needed = -(-e.max_model_len // e.block_size)
            assert isinstance(e.num_gpu_blocks, int)  # ("auto" is resolved when the spec is validated)
            if e.num_gpu_blocks < needed:
                raise sc._fail(
                    ("cluster", role, "engine", "num_gpu_blocks"),
                    f"cluster.{role}.engine: num_gpu_blocks={e.num_gpu_blocks} x block_size={e.block_size} "
                    f"holds {e.num_gpu_blocks * e.block_size} tokens, less than one max_model_len="
                    f"{e.max_model_len} request (variant {v.name!r}); allowed: num_gpu_blocks >= {needed}, or "
                    f"max_model_len <= {e.num_gpu_blocks * e.block_size} (vLLM refuses to start such an engine)",
                    v,
                )


def check_prompts_fit(sc: CheckedScenario) -> None:
    """Every prompt fits the serving nodes' max_model_len (vLLM rejects longer prompts)."""
    checked: set[tuple] = set()
    for v in sc.variants:
        spec = sc._clusters[v.name]
        limits = [(r, g.engine.max_model_len) for r, g in (("prefill", spec.prefill), ("decode", spec.decode))]
        role, limit = min(((r, m) for r, m in limits if (spec.prefill.count or r == "decode")), key=lambda x: x[1])
        wspec = sc._workload_specs[v.name]
        if wspec is not None and _static_max(wspec.prompt_len) <= limit:
            continue
        for repeat in range(sc.file.repeats):
            seed = sc.file.seed + repeat
            key = (wspec.model_dump_json() if wspec is not None else "trace", seed if wspec else 0, limit)
            if key in checked:
                continue
            checked.add(key)
            requests, _ = sc.workload(v.name, seed)
            over = [w.prompt_len for w in requests if w.prompt_len > limit]
            if over:
                what = "workload.prompt_len" if wspec is not None else "trace"
                raise sc._fail(
                    ("workload", "prompt_len") if wspec is not None else ("trace", "path"),
                    f"{what}: {len(over)} of {len(requests)} prompts (variant {v.name!r}, seed {seed}) are longer "
                    f"than cluster.{role}.engine.max_model_len={limit} (the longest: {max(over)} tokens); allowed: "
                    "prompts <= max_model_len (vLLM rejects longer ones) - cap the lengths (e.g. prompt_len.max) "
                    "or raise max_model_len",
                    v,
                )


def check_report(sc: CheckedScenario) -> None:
    report = sc.file.report
    if report.baseline is not None and report.baseline not in sc._clusters:
        raise sc._fail(
            ("report", "baseline"),
            f"report.baseline={report.baseline!r} is not a variant{did_you_mean(report.baseline, sc._clusters)}; "
            f"allowed: {', '.join(sc._clusters)}",
        )
    known = sc.known_metrics()
    for i, metric in enumerate(report.metrics):
        if metric not in known:
            raise sc._fail(
                ("report", "metrics", i),
                f"report.metrics[{i}]={metric!r} is not a metric of this scenario's results"
                f"{did_you_mean(metric, known)} (`disagg-sim schema --metrics` lists them)",
            )
    if report.best is not None and report.best.metric not in known:
        metric = report.best.metric
        raise sc._fail(
            ("report", "best", "metric"),
            f"report.best.metric={metric!r} is not a metric of this scenario's results"
            f"{did_you_mean(metric, known)} (`disagg-sim schema --metrics` lists them)",
        )


def check_thresholds(sc: CheckedScenario) -> None:
    """Thresholds parse, and every metric and variant they name exists."""
    known = None
    for i, text in enumerate(sc.file.thresholds):
        where = ("thresholds", i)
        try:
            tree = parse_threshold(text)
        except ThresholdError as exc:
            raise sc._fail(where, f"thresholds[{i}]: {exc}") from None
        for ref in threshold_refs(tree):
            variant, node = split_variant(ref.variant)
            if variant not in sc._clusters:
                raise sc._fail(
                    where,
                    f"threshold {text!r} names variant {variant!r}{did_you_mean(variant, sc._clusters)}; "
                    f"allowed: {', '.join(sc._clusters)}",
                )
            nodes = [spec.name for _, spec, _ in sc._clusters[variant].node_specs()]
            if node is not None and node not in nodes:
                raise sc._fail(
                    where,
                    f"threshold {text!r} names node {node!r} of variant {variant!r}{did_you_mean(node, nodes)}; "
                    f"allowed: {', '.join(nodes)}",
                )
            known = known if known is not None else sc.known_metrics()
            if ref.metric not in known:
                raise sc._fail(
                    where,
                    f"threshold {text!r} names metric {ref.metric!r}, which this scenario's results do not have"
                    f"{did_you_mean(ref.metric, known)} (`disagg-sim schema --metrics` lists them)",
                )


def _static_max(spec: Any) -> float:
    """The longest length a distribution can draw, or inf when it is unbounded."""
    kind = spec.kind
    top = {"fixed": lambda: spec.value, "uniform": lambda: spec.high, "sharegpt_like": lambda: 1024}.get(kind)
    bound = float(top()) if top is not None else math.inf
    if kind == "empirical":
        from .workloads.lengths import load_empirical_cdf

        bound = float(max(load_empirical_cdf(spec.path)[0]))
    if spec.max is not None:
        bound = min(bound, float(spec.max))
    return max(bound, float(spec.min))


def threshold_refs(tree):
    """Every metric[variant] reference in a parsed threshold."""
    if isinstance(tree, Ref):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for part in tree:
            yield from threshold_refs(part)
