"""A fleet run streams its records (`InProcCluster(stream=...)`,
bench/metrics_stream.py): the run keeps no request or step record, and the
metrics folded from the stream are the ones computed from kept records."""

from __future__ import annotations

import math

import pytest

from bench.metrics import compute_metrics
from bench.metrics_stream import StreamedMetrics
from bench.workloads import generate_workload, parse_workload_spec
from cluster.inproc import InProcCluster
from cluster.spec import ClusterSpec

SPEC = {"prefill": {"count": 2}, "decode": {"count": 3}, "routing": "least_loaded"}
WORKLOAD = {
    "num_requests": 1500,
    "prompt_len": {"kind": "uniform", "low": 64, "high": 256},
    "output_len": {"kind": "uniform", "low": 1, "high": 48},
    "arrival": {"kind": "poisson", "rate": 100},
}


@pytest.fixture(scope="module")
def runs():
    spec = ClusterSpec.model_validate(SPEC)
    workload = generate_workload(parse_workload_spec(WORKLOAD))
    kept = InProcCluster(spec, seed=0)
    kept.submit(workload)
    kept_result = kept.run()
    stream = StreamedMetrics(t0=workload[0].arrival_time)
    batches: list[int] = []

    def sink(batch):
        batches.append(len(batch))
        stream.add(batch)

    fleet = InProcCluster(spec, seed=0, stream=sink, keep_steps=False)
    fleet.client.stream_batch = 256
    fleet.submit(workload)
    fleet_result = fleet.run()
    return kept_result, fleet, fleet_result, stream, batches


def test_a_streamed_run_keeps_no_records_and_no_steps(runs):
    kept, fleet, result, _, batches = runs
    assert result.requests == [] and result.steps == [] and fleet.client.records == {}
    assert result.invariant_errors == []
    # Handed over in batches during the run (not all at the end), every request once.
    assert batches[:5] == [256] * 5 and sum(batches) == 1500
    # The steps are counted, the same as the kept run's records.
    assert result.extra["num_steps"] == len(kept.steps)
    assert result.duration == kept.duration


def test_streamed_metrics_equal_those_of_the_kept_records(runs):
    kept, _, result, stream, _ = runs
    want = compute_metrics(kept.requests, duration=kept.duration).to_dict()
    got = stream.to_dict(result.duration)
    assert set(got) == set(want)
    # The ITL mean and std are sums over a table of counted gaps: the same up to the last bits.
    for key in ("mean_itl_ms", "std_itl_ms"):
        assert math.isclose(got.pop(key), want.pop(key), rel_tol=1e-12)
    assert got == want


def test_itl_gaps_past_the_table_bound_are_kept_to_four_digits(monkeypatch):
    import bench.metrics_stream as ms

    monkeypatch.setattr(ms, "ITL_MAX_KEYS", 3)
    stream = StreamedMetrics()
    from engine.records import RequestRecord

    rec = RequestRecord("r", 0.0, 4, 6, token_times=[1.0, 1.012345, 1.024690, 1.0370351, 1.05, 1.06])
    rec.output_token_ids = [1] * 6
    rec.finish_time, rec.finish_reason = 1.06, "length"
    stream.add([rec])
    out = stream.to_dict(1.06)
    assert out["itl_rounded_to_digits"] == 4
    assert all(float(f"{k:.4g}") == k for k in stream.itl_counts) and len(stream.itl_counts) == 3
    assert sum(stream.itl_counts.values()) == 5
