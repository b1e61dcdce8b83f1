"""Which metric names a scenario's results will have, known before anything runs.

Thresholds and `report.metrics` name metrics; a misspelt one used to pass
`validate` and fail after every run had finished. The names come from the
code that produces them, not from a list kept by hand:

- `vllm bench serve`'s keys for the scenario's percentiles (`compute_metrics`);
- the step aggregates (`step_aggregates` of one step);
- every counter the scenario's nodes report: a small cluster of the same
  kinds of node (engine v1/v0, disaggregated or not) is built — not run —
  and asked for its counters;
- the per-reason KV pull failures (`kv_pulls_failed_<reason>`), which
  results always carry (zero when nothing failed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cluster.spec import ClusterSpec
from connector.transport import PullFailure
from engine.records import StepRecord

from .metrics import compute_metrics, step_aggregates

# Numeric keys of a result that describe the run rather than measure it, but
# may still be compared (e.g. `failed`, already among the serving keys).
IDENTITY_METRICS = ("repeat", "seed")
PULL_FAILURE_METRICS = tuple(f"kv_pulls_failed_{f.value}" for f in PullFailure)


def serving_metric_names(percentiles: Sequence[float]) -> set[str]:
    return set(compute_metrics([], percentiles=percentiles, duration=0.0).to_dict())


def step_metric_names() -> set[str]:
    step = StepRecord(
        node="n",
        time=0.0,
        step_index=0,
        batch_size=0,
        num_scheduled_tokens=0,
        num_prefill_tokens=0,
        num_decode_tokens=0,
        num_running=0,
        num_waiting=0,
        num_waiting_for_remote_kvs=0,
        num_free_blocks=0,
        num_deferred_blocks=0,
        num_total_blocks=1,
        batches_in_flight=0,
        num_preemptions_total=0,
        num_zero_progress_preemptions_total=0,
    )
    agg = step_aggregates([step])
    agg.pop("per_node")
    return set(agg)


def counter_names(specs: Iterable[ClusterSpec]) -> set[str]:
    """Every counter the nodes of these clusters report, from one small
    stand-in cluster per kind of topology (counter names do not depend on sizes)."""
    from cluster.inproc import InProcCluster

    kinds = {(s.prefill.engine.engine if s.prefill.count else None, s.decode.engine.engine, s.shadow_kv) for s in specs}
    names: set[str] = set()
    for prefill_engine, decode_engine, shadow in sorted(kinds, key=str):
        small = {"num_gpu_blocks": 16, "max_model_len": 64, "max_num_batched_tokens": 64, "max_num_seqs": 4}
        stand_in = ClusterSpec.model_validate(
            {
                "prefill": {"count": 1 if prefill_engine else 0, "engine": {"engine": prefill_engine or "v1", **small}},
                "decode": {"count": 1, "engine": {"engine": decode_engine, **small}},
                "shadow_kv": shadow,
            }
        )
        cluster = InProcCluster(stand_in)
        for node in cluster.nodes.values():
            names.update(k for k, v in node.counters().items() if isinstance(v, (int, float)))
    if any(s.disaggregated for s in specs):
        names.update(PULL_FAILURE_METRICS)
    if "prefix_cache_queries" in names:
        names.add("prefix_cache_hit_rate_pct")  # derived from the summed counters (bench/results.py)
    return names


GOODPUT_METRICS = ("request_goodput", "slo_attainment_pct")


def known_metric_names(specs: Iterable[ClusterSpec], percentiles: Sequence[float], slo: bool = False) -> set[str]:
    """`slo`: the scenario sets latency targets (its results have the goodput keys)."""
    specs = list(specs)
    names = serving_metric_names(percentiles) | step_metric_names() | counter_names(specs) | set(IDENTITY_METRICS)
    return names | set(GOODPUT_METRICS) if slo else names
