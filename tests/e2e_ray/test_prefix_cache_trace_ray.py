"""The shared-prefix Mooncake trace on Ray: the same hit counts as the trace
implies (and as the in-process runtime gets), across real processes."""

from __future__ import annotations

import pytest

from bench.traces import load_trace
from cluster.ray.runtime import run_ray
from tests.e2e_inproc.test_prefix_cache_trace import TRACE, expected_hits, spec

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_the_trace_replays_on_ray_with_the_hit_rate_it_implies(ray_cluster):
    workload = load_trace(TRACE, time_scale=0.2)
    result = run_ray(spec(), workload, seed=0, handle=ray_cluster, timeout_s=60)
    assert result.invariant_errors == []
    c = result.node_counters["decode-0"]
    assert (c["prefix_cache_queries"], c["prefix_cache_hits"]) == expected_hits()
