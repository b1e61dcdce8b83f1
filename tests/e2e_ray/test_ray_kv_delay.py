"""Delay injected on the KV link (a gRPC client interceptor on the decode
node's channel) shows up in TTFT across processes. A pull is one round
trip on the critical path — the request out, the blocks back (the
consumer tells the producer it is done afterwards, off the path) — so a
one-way delay D raises the median TTFT by about 2 D."""

import statistics

import pytest

from cluster.ray.runtime import run_ray

from .conftest import make_spec, workload

pytestmark = [pytest.mark.ray, pytest.mark.timeout(150)]

DELAY_MS = 60.0


def _medians(result):
    ttft = statistics.median(r.ttft for r in result.requests)
    kv_wait = statistics.median(r.remote_kv_wait for r in result.requests)
    return ttft, kv_wait


def test_kv_link_delay_raises_median_ttft_by_one_round_trip(ray_cluster):
    # Requests spaced out, so they do not queue behind each other.
    wl = workload(10, 64, 8, gap_s=0.15)
    runs = {}
    for delay in (0.0, DELAY_MS):
        spec = make_spec(links={"kv": {"delay_ms": delay}})
        result = run_ray(spec, wl, seed=0, handle=ray_cluster, timeout_s=60)
        assert result.invariant_errors == []
        assert {r.finish_reason for r in result.requests} == {"length"}
        runs[delay] = _medians(result)
    expected = 2 * DELAY_MS / 1000
    ttft_rise = runs[DELAY_MS][0] - runs[0.0][0]
    kv_wait_rise = runs[DELAY_MS][1] - runs[0.0][1]
    # Wide bounds: a shared 2-core box; asyncio timers fire up to 1 ms late.
    assert 0.75 * expected <= ttft_rise <= 1.5 * expected + 0.02, (ttft_rise, runs)
    assert 0.75 * expected <= kv_wait_rise <= 1.5 * expected + 0.02, (kv_wait_rise, runs)
