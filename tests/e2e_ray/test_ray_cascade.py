"""The multi-victim preemption cascade (vLLM #49674) and its fix (PR #49675)
across processes: a decode node (kv_consumer, async scheduling, so two
batches are in flight and the deferred-free fence is armed) with a tight
block pool, its KV pulled over gRPC from a prefill node, its steps run by a
stage actor. Scaled down from the default scenario (80 x 448 tokens, ~500
blocks) so each run takes seconds; in-process the same workload gives
prefix 298 preemptions (all zero-progress) vs fixed 36."""

import pytest

from cluster.ray.runtime import run_ray

from .conftest import make_spec, workload

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


def cascade_spec(guard: str, fence: str = "auto"):
    return make_spec(
        decode={
            "count": 1,
            "engine": {
                "num_gpu_blocks": 250,
                "max_num_seqs": 128,
                "async_scheduling": True,
                "preemption_guard": guard,
                "fence": fence,
            },
        },
        links={"kv": {"delay_ms": 1.0}},
        time_scale=0.05,
    )


CASCADE_WORKLOAD = workload(40, 128, 224)


@pytest.fixture(scope="module")
def guard_runs(ray_cluster):
    return {
        guard: run_ray(cascade_spec(guard), CASCADE_WORKLOAD, seed=1, handle=ray_cluster, timeout_s=120)
        for guard in ("prefix", "fixed")
    }


def test_the_pre_fix_guard_cascades_and_the_fix_stops_it(guard_runs):
    prefix = guard_runs["prefix"].counters_for("decode")
    fixed = guard_runs["fixed"].counters_for("decode")
    assert prefix["num_zero_progress_preemptions"] > 0
    assert prefix["num_preemptions"] >= 4 * fixed["num_preemptions"] > 0
    assert fixed["num_zero_progress_preemptions"] == 0
    assert fixed["num_fence_stopped_retries"] > 0  # the fix did engage


def test_with_the_fence_on_every_pool_ends_free_and_nothing_is_corrupted(guard_runs):
    for guard, result in guard_runs.items():
        assert result.invariant_errors == [], guard
        assert [r.finish_reason for r in result.requests] == ["length"] * len(CASCADE_WORKLOAD), guard
        assert result.counters()["kv_corruptions_detected"] == 0, guard
        assert result.violations == [], guard


def test_with_the_fence_forced_off_in_flight_writes_corrupt_reused_blocks(ray_cluster):
    result = run_ray(cascade_spec("fixed", fence="off"), CASCADE_WORKLOAD, seed=1, handle=ray_cluster, timeout_s=120)
    decode = result.counters_for("decode")
    assert decode["kv_corruptions_detected"] > 0
    assert decode["shadow_stale_writes"] > 0
    assert {v["kind"] for v in result.violations} >= {"stale_write"}
    assert all(v["node"] == "decode-0" for v in result.violations)


def test_every_run_measures_its_time_distortion(guard_runs):
    # What is measured, not how much (that is the machine's): every node that
    # ran steps has its overhead against the scaled model, and the run names
    # its worst node; above 10 % it also names a time_scale.
    for guard, result in guard_runs.items():
        d = result.extra["distortion"]
        assert d["time_scale"] == 0.05 and set(d["nodes"]) == {"prefill-0", "decode-0"}, guard
        decode = d["nodes"]["decode-0"]
        assert decode["steps"] > 100 and decode["mean_scaled_ms"] == pytest.approx(
            decode["mean_modelled_ms"] * 0.05, rel=1e-3
        )
        assert d["worst_node"] in d["nodes"] and ("warning" in d) == (d["overhead_pct"] > 10), guard
        if "warning" in d:
            assert d["suggested_time_scale"] > 0.05
