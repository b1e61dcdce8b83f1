"""The P/D connector roles driven by hand, with no transport: the worker side
is played by the test (it reports `finished_recving` / `finished_sending`)."""

from engine.outputs import KVConnectorOutput, ModelRunnerOutput
from engine.request import RequestStatus
from engine.testing import create_requests, create_scheduler

from .fence_helpers import output_for


def kv_output(**sets) -> ModelRunnerOutput:
    return ModelRunnerOutput([], {}, [], kv_connector_output=KVConnectorOutput(**sets))


def free(s):
    return s.kv_cache_manager.block_pool.get_num_free_blocks()


def test_producer_holds_blocks_until_finished_sending():
    p = create_scheduler(kv_role="kv_producer", num_blocks=50)
    (req,) = create_requests(1, num_tokens=40, max_tokens=1)
    req.kv_transfer_params = {"do_remote_decode": True}
    p.add_request(req)
    out = p.schedule()
    result = p.update_from_output(out, output_for(out))
    (eco,) = result[0].outputs
    assert eco.finish_reason == "length"
    params = eco.kv_transfer_params
    assert params["do_remote_prefill"] and params["remote_block_ids"] == [1, 2, 3]
    assert req.request_id in p.requests and free(p) == 49 - 3  # held for the pull (§7.23)
    assert p.has_requests()
    p.update_from_output(p.schedule(), kv_output(finished_sending={req.request_id}))
    assert req.request_id not in p.requests and free(p) == 49


def test_consumer_async_load_then_promotion():
    c = create_scheduler(kv_role="kv_consumer", num_blocks=50)
    (req,) = create_requests(1, num_tokens=40, max_tokens=3)
    req.kv_transfer_params = {"do_remote_prefill": True, "remote_block_ids": [7, 8, 9], "remote_engine_id": "p0"}
    c.add_request(req)
    out = c.schedule()
    assert out.total_num_scheduled_tokens == 0  # an async load uses no budget
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert req.num_computed_tokens == 40 and free(c) == 49 - 3
    (spec,) = out.kv_connector_metadata.reqs_to_recv.values()
    assert spec.remote_block_ids == [7, 8, 9] and len(spec.local_block_ids) == 3
    c.update_from_output(out, output_for(out))
    out = c.schedule()
    assert out.total_num_scheduled_tokens == 0  # still loading
    c.update_from_output(out, kv_output(finished_recving={req.request_id}))
    out = c.schedule()
    # Promoted: the last prompt token is recomputed to sample the first output.
    assert out.num_scheduled_tokens == {req.request_id: 1}
    assert [n.req_id for n in out.scheduled_new_reqs] == [req.request_id]
    assert req.status == RequestStatus.RUNNING


def test_abort_during_load_keeps_blocks_until_the_receive_completes():
    c = create_scheduler(kv_role="kv_consumer", num_blocks=50)
    (req,) = create_requests(1, num_tokens=40, max_tokens=3)
    req.kv_transfer_params = {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3]}
    c.add_request(req)
    c.update_from_output(c.schedule(), ModelRunnerOutput.empty())
    c.finish_requests([req.request_id], RequestStatus.FINISHED_ABORTED)
    assert free(c) == 46 and req.request_id in c.requests  # §7.22
    c.update_from_output(c.schedule(), kv_output(finished_recving={req.request_id}))
    assert free(c) == 49 and req.request_id not in c.requests


def test_failed_load_recompute_policy_recomputes_locally():
    c = create_scheduler(kv_role="kv_consumer", num_blocks=50, kv_load_failure_policy="recompute")
    (req,) = create_requests(1, num_tokens=40, max_tokens=3)
    req.kv_transfer_params = {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3]}
    c.add_request(req)
    c.update_from_output(c.schedule(), ModelRunnerOutput.empty())
    c.update_from_output(c.schedule(), kv_output(finished_recving={req.request_id}, failed_recving={req.request_id}))
    out = c.schedule()
    assert out.num_scheduled_tokens == {req.request_id: 40}  # the whole prompt, locally


def test_failed_load_fail_policy_finishes_with_error():
    c = create_scheduler(kv_role="kv_consumer", num_blocks=50, kv_load_failure_policy="fail")
    (req,) = create_requests(1, num_tokens=40, max_tokens=3)
    req.kv_transfer_params = {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3]}
    c.add_request(req)
    c.update_from_output(c.schedule(), ModelRunnerOutput.empty())
    result = c.update_from_output(
        c.schedule(), kv_output(finished_recving={req.request_id}, failed_recving={req.request_id})
    )
    (eco,) = result[0].outputs
    assert eco.finish_reason == "error" and req.status == RequestStatus.FINISHED_ERROR
    assert free(c) == 49 and not c.requests


def test_not_yet_matched_request_returns_to_the_head_of_its_queue():
    """§7.21: a connector answering None skips the request without budget; it
    is put back at the head of `waiting`, ahead of later arrivals."""
    c = create_scheduler(kv_role="kv_consumer", num_blocks=50)
    a, b, d = create_requests(3, num_tokens=16, max_tokens=3, req_ids=["A", "B", "C"])
    original = c.connector.get_num_new_matched_tokens
    c.connector.get_num_new_matched_tokens = lambda r, n: (None, False) if r.request_id == "A" else original(r, n)
    for r in (a, b, d):
        c.add_request(r)
    out = c.schedule()
    assert set(out.num_scheduled_tokens) == {"B", "C"}
    assert [r.request_id for r in c.waiting] == ["A"]
    assert a in c.deferred_waiting


def test_stale_output_blocks_readmission_until_it_returns():
    """§7.18: a preempted consumer request with in-flight output is not readmitted."""
    s = create_scheduler(num_blocks=5, async_scheduling=True, kv_role="kv_consumer", defer_block_free=False)
    keep, victim = create_requests(2, num_tokens=32, max_tokens=10, req_ids=["keep", "victim"])
    s.add_request(keep)
    s.add_request(victim)
    s.schedule()
    out2 = s.schedule()
    assert out2.preempted_req_ids == {"victim"}
    assert victim.num_stale_output_tokens == 32 and not victim.drop_stale_output
    out3 = s.schedule()
    assert "victim" not in out3.num_scheduled_tokens and list(s.waiting) == [victim]
