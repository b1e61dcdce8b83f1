"""The collector pause of in-process runs (cluster/inproc/collector.py): a
process running one simulation after another frees the earlier ones. A
finished run is garbage with cycles (cluster, nodes and event loop refer to
each other), which only a full collection frees, and objects moved to the
oldest generation by the pause never make CPython start one."""

from __future__ import annotations

import gc
import weakref

import pytest

from cluster.inproc import collector
from cluster.inproc.cluster import InProcCluster
from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest

SPEC = ClusterSpec.model_validate(
    {
        "prefill": {"count": 1, "engine": {"num_gpu_blocks": 200}},
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 200}},
        "cost_model": "unit",
    }
)
WORKLOAD = [WorkloadRequest(f"r{i}", 0.01 * i, 40, 20) for i in range(12)]


@pytest.fixture
def fresh_tracking(monkeypatch):
    """Counting from here, as in a fresh process (nothing pending, nothing collected)."""
    gc.collect()
    monkeypatch.setattr(collector._Tracked, "base", 0)
    monkeypatch.setattr(collector._Tracked, "pending", 0)


def _run_and_drop() -> weakref.ref:
    cluster = InProcCluster(SPEC, seed=0)
    cluster.submit(WORKLOAD)
    result = cluster.run()
    assert len(result.requests) == len(WORKLOAD) and not result.invariant_errors
    return weakref.ref(cluster)


def test_earlier_runs_are_freed_by_the_next_runs(fresh_tracking, monkeypatch) -> None:
    # Every run's garbage is worth a collection.
    monkeypatch.setattr(collector, "GROWTH_FLOOR", 1)
    monkeypatch.setattr(collector, "GROWTH_FRACTION", 0)
    clusters = [_run_and_drop() for _ in range(5)]
    alive = [ref() is not None for ref in clusters]
    # Each run's start collects the runs before it; the last one waits for the next pause.
    assert alive == [False, False, False, False, True]


def test_without_the_made_up_collections_every_run_would_stay(fresh_tracking, monkeypatch) -> None:
    """What the made-up collection is for: the pause alone keeps them all."""
    monkeypatch.setattr(collector, "collect_earlier_runs", lambda: False)
    clusters = [_run_and_drop() for _ in range(3)]
    assert all(ref() is not None for ref in clusters)
    gc.collect()
    assert all(ref() is None for ref in clusters)


def test_no_collection_while_the_growth_is_under_the_floor(fresh_tracking, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    _run_and_drop()
    _run_and_drop()
    assert calls == [] and 0 < collector._Tracked.pending <= collector.GROWTH_FLOOR


def test_a_collection_starts_counting_again(fresh_tracking, monkeypatch) -> None:
    monkeypatch.setattr(collector, "GROWTH_FLOOR", 1)
    monkeypatch.setattr(collector, "GROWTH_FRACTION", 0)
    _run_and_drop()
    assert collector._Tracked.pending > 1
    assert collector.collect_earlier_runs()
    assert collector._Tracked.pending == 0 and collector._Tracked.base > 0
    assert not collector.collect_earlier_runs()


def test_the_growth_is_counted_against_what_the_last_collection_left(fresh_tracking, monkeypatch) -> None:
    monkeypatch.setattr(collector, "GROWTH_FLOOR", 1)
    monkeypatch.setattr(collector._Tracked, "base", 10**9)  # a quarter of it: far more than a run leaves
    _run_and_drop()
    assert not collector.collect_earlier_runs()
