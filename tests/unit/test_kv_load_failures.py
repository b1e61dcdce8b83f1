"""Block-level KV load failures (`invalid_block_ids`), driven by hand: vLLM
0.33.0's `_handle_invalid_blocks` (docs/reference.md, v1 §8). The same facts
are checked against vLLM itself by the hand-written P/D conformance scenarios
(`hand-pd-load-fails-*`)."""

import pytest

from engine.outputs import KVConnectorOutput, ModelRunnerOutput
from engine.request import RequestStatus
from engine.testing import create_requests, create_scheduler

from .fence_helpers import output_for


def kv_output(**sets) -> ModelRunnerOutput:
    return ModelRunnerOutput([], {}, [], kv_connector_output=KVConnectorOutput(**sets))


def free(s) -> int:
    return s.kv_cache_manager.block_pool.get_num_free_blocks()


def start_load(policy: str, enable_prefix_caching: bool = False):
    c = create_scheduler(
        kv_role="kv_consumer",
        num_blocks=50,
        kv_load_failure_policy=policy,
        enable_prefix_caching=enable_prefix_caching,
    )
    (req,) = create_requests(1, num_tokens=40, max_tokens=3)
    req.kv_transfer_params = {"do_remote_prefill": True}
    c.add_request(req)
    out = c.schedule()
    (spec,) = out.kv_connector_metadata.reqs_to_recv.values()
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and len(spec.local_block_ids) == 3
    return c, req, spec.local_block_ids, out


def test_recompute_keeps_the_prefix_before_the_first_invalid_block():
    c, req, blocks, out = start_load("recompute")
    c.update_from_output(out, kv_output(finished_recving={req.request_id}, invalid_block_ids={blocks[1]}))
    assert req.num_computed_tokens == 16  # blocks[0] loaded, blocks[1:] did not
    assert c.failed_recving_kv_req_ids == {req.request_id}
    out = c.schedule()
    assert out.num_scheduled_tokens == {req.request_id: 40 - 16}  # computed locally
    assert req.status == RequestStatus.RUNNING and free(c) == 49 - 3
    assert not c.failed_recving_kv_req_ids


def test_recompute_after_the_first_block_failed_frees_the_blocks_and_starts_over():
    c, req, blocks, out = start_load("recompute")
    c.update_from_output(out, kv_output(finished_recving={req.request_id}, invalid_block_ids={blocks[0]}))
    assert req.num_computed_tokens == 0
    out = c.schedule()
    # Nothing valid: the blocks went back to the pool and the prompt is recomputed.
    assert out.num_scheduled_tokens == {req.request_id: 40}


@pytest.mark.parametrize("first_invalid", [0, 2])
def test_fail_finishes_the_request_with_an_error_and_frees_its_blocks(first_invalid):
    c, req, blocks, out = start_load("fail")
    result = c.update_from_output(
        out, kv_output(finished_recving={req.request_id}, invalid_block_ids=set(blocks[first_invalid:]))
    )
    (eco,) = result[0].outputs
    assert eco.request_id == req.request_id and eco.finish_reason == "error" and eco.new_token_ids == []
    assert req.status == RequestStatus.FINISHED_ERROR
    assert req.request_id not in c.requests and free(c) == 49


def test_invalid_blocks_of_another_request_change_nothing():
    c, req, blocks, out = start_load("fail")
    c.update_from_output(out, kv_output(invalid_block_ids={max(blocks) + 1}))
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and req.num_computed_tokens == 40


def test_fail_evicts_a_running_requests_invalid_blocks_from_the_prefix_cache():
    """The sync-load path: a running request whose computed blocks are reported
    invalid fails, and under `fail` those blocks leave the prefix cache."""
    c = create_scheduler(
        kv_role="kv_consumer", num_blocks=50, kv_load_failure_policy="fail", enable_prefix_caching=True
    )
    (req,) = create_requests(1, num_tokens=40, max_tokens=5)
    c.add_request(req)
    out = c.schedule()
    c.update_from_output(out, output_for(out))
    pool = c.kv_cache_manager.block_pool
    block_ids = c.kv_cache_manager.get_block_ids(req.request_id)
    assert len(pool.cached_block_hash_to_block) == 2  # the two full prompt blocks
    out = c.schedule()
    c.update_from_output(out, kv_output(invalid_block_ids={block_ids[1]}))
    assert req.status == RequestStatus.FINISHED_ERROR
    assert len(pool.cached_block_hash_to_block) == 1  # block 1 and after evicted, block 0 kept
