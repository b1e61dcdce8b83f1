"""A request end to end across processes: proxy -> prefill node -> KV pull
over gRPC -> decode node (through its pipeline stage actors) -> tokens back."""

import pytest

from cluster.ray.runtime import run_ray
from engine.sampler import DeterministicSampler

from .conftest import make_spec, workload

pytestmark = [pytest.mark.ray, pytest.mark.timeout(150)]

PROMPT, OUTPUT, N = 100, 24, 6
BLOCKS_PER_PROMPT = 7  # ceil(100 / 16)


@pytest.mark.parametrize("pp_size", [1, 2])
def test_requests_flow_through_prefill_kv_pull_and_decode_with_every_block_verified(ray_cluster, pp_size):
    spec = make_spec(
        decode={"count": 1, "pp_size": pp_size, "engine": {"num_gpu_blocks": 1000, "async_scheduling": True}},
        links={"kv": {"delay_ms": 1.0}, "stage": {"delay_ms": 0.5}, "proxy": {"delay_ms": 0.5}},
    )
    result = run_ray(spec, workload(N, PROMPT, OUTPUT, gap_s=0.02), seed=3, handle=ray_cluster, timeout_s=60)

    assert result.clock == "wall"
    assert result.invariant_errors == []  # tokens in order, all terminal, every pool fully free
    assert [r.finish_reason for r in result.requests] == ["length"] * N
    sampler = DeterministicSampler(spec.sampler.seed + 3)
    for rec in result.requests:
        assert rec.output_token_ids == [sampler.token_at(rec.request_id, PROMPT + i) for i in range(OUTPUT)]
        assert rec.first_scheduled_time <= rec.remote_kv_wait_start <= rec.remote_kv_wait_end <= rec.token_times[0]
    decode, prefill = result.node_counters["decode-0"], result.node_counters["prefill-0"]
    assert (decode["kv_pulls_started"], decode["kv_pulls_completed"], decode["kv_pulls_failed"]) == (N, N, 0)
    assert decode["kv_blocks_verified"] == N * BLOCKS_PER_PROMPT
    assert (decode["kv_checksum_failures"], decode["kv_block_content_mismatches"]) == (0, 0)
    assert prefill["kv_blocks_served"] == N * BLOCKS_PER_PROMPT
    assert (prefill["kv_done_reports"], prefill["kv_hold_timeouts"]) == (N, 0)
    assert decode["stage_token_mismatches"] == 0
    assert result.violations == [] and result.counters()["kv_corruptions_detected"] == 0
    assert {s.node for s in result.steps} == {"prefill-0", "decode-0"}
    stages = {f"decode-0/stage{i}" for i in range(pp_size)}
    assert set(result.extra["placement"]) == {"proxy", "prefill-0", "decode-0"} | stages
