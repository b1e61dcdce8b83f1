"""A v0 node on the wall-clock runtime's node classes (the ones the Ray actors
wrap), in one process over 127.0.0.1 without Ray: the same NodeCore, so swap
preemptions, the shadow KV copies and the end-of-run checks hold there too.
Reuses the Ray suite's in-process harness (`tests/e2e_ray/test_nodes_without_ray.py`)."""

import asyncio
import logging

import pytest

from tests.e2e_ray.conftest import make_spec, workload
from tests.e2e_ray.test_nodes_without_ray import _check, run_local

pytestmark = pytest.mark.timeout(60)


def test_a_v0_node_serves_whole_requests_on_the_wall_clock_nodes(caplog):
    caplog.set_level(logging.ERROR, logger="vllm.v0")
    spec = make_spec(
        prefill={"count": 0},
        time_scale=0.05,
        decode={
            "count": 1,
            "engine": {
                "engine": "v0",
                "num_gpu_blocks": 64,
                "enable_chunked_prefill": False,
                "max_num_batched_tokens": 1024,
                "max_model_len": 1024,
                "num_cpu_blocks": 64,
                "preemption_mode": "swap",
            },
        },
    )
    wl = workload(20, 120, 60)
    driver, nodes = asyncio.run(asyncio.wait_for(run_local(spec, wl, seed=2), 45))
    _check(driver, nodes, spec, 2, len(wl))  # tokens, block conservation, pool all free, no corruption
    report = nodes["decode-0"].report()
    assert report.counters["num_preemptions_swap"] > 0 and report.counters["shadow_read_missing"] == 0
    assert {s.batches_in_flight for s in report.steps} == {1}
