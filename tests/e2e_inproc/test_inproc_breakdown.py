"""benchmarks/inproc_breakdown.py times every event by wrapping its handler:
the wrapped run must be the run inproc_speed times (the fast-forward reads
handlers' `__func__` and `__self__` when it looks at the queue)."""

from __future__ import annotations

import pytest

from benchmarks.inproc_breakdown import one_run
from benchmarks.inproc_speed import cluster_dict, workload_rows
from cluster.inproc import run_inproc
from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest


@pytest.mark.parametrize(("topology", "caching"), [("agg", False), ("1P1D", False), ("1P1D", True)])
def test_timed_run_is_the_plain_run(topology: str, caching: bool) -> None:
    n = 150
    wl = [WorkloadRequest(*r) for r in workload_rows("W1", n)]
    spec = ClusterSpec.model_validate(cluster_dict(topology, False, old=False, caching=caching))
    plain = run_inproc(spec, wl, seed=0)
    timed = one_run("W1", n, topology, shadow=False, caching=caching)
    result = timed["result"]
    assert [s.to_dict() for s in result.steps] == [s.to_dict() for s in plain.steps]
    assert [(r.request_id, r.output_token_ids, r.token_times) for r in result.requests] == [
        (r.request_id, r.output_token_ids, r.token_times) for r in plain.requests
    ]
    assert result.extra == plain.extra  # the same events, and as many steps forwarded
    assert timed["steps"]["decode-0"]["forwarded"] == plain.extra["steps_fast_forwarded"] > 0

    # Every event that ran was timed, under its handler and node.
    keys = set(timed["times"])
    assert "VirtualPipelineExecutor._done [decode-0]" in keys
    assert "LoadDriver.arrive [proxy]" in keys
    if topology == "1P1D":
        assert {"VirtualPipelineExecutor._done [prefill-0]", "InProcKVTransport._serve [KV hand-over]"} <= keys
    # Scheduled at least as many as ran (a cancelled timer never runs).
    assert sum(timed["counts"].values()) >= result.extra["num_events"]
    steps = timed["steps"]
    assert sum(c["plain"] + c["forwarded"] for c in steps.values()) == len(result.steps)
