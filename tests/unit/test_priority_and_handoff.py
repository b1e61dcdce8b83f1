"""The PRIORITY cursor fix (PR #49206) and preemption in the middle of a P/D
hand-off (`test_kv_pressure_preempt_mid_handoff`, three variants)."""

from engine.request import RequestStatus
from engine.testing import create_requests, create_scheduler

from .fence_helpers import AllocationSpy, output_for


def _priority_trio():
    s = create_scheduler(
        policy="priority",
        max_num_seqs=5,
        max_num_batched_tokens=200,
        max_model_len=1000,
        long_prefill_token_threshold=15,
        num_blocks=100,
        scheduler_reserve_full_isl=False,
    )
    a, b, c = (
        create_requests(
            1, num_tokens=n, max_tokens=50, req_ids=[rid], priorities=[p], arrival_times=[t], ignore_eos=True
        )[0]
        for rid, n, p, t in (("A", 200, 9, 1.0), ("B", 15, 0, 2.0), ("C", 1, 1, 3.0))
    )
    return s, a, b, c


def test_priority_cursor_after_preempting_a_skipped_victim():
    s, a, b, c = _priority_trio()
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    assert out.num_scheduled_tokens == {"B": 15, "A": 15}
    s.update_from_output(out, output_for(out))
    s.add_request(c)
    out = s.schedule()
    assert out.num_scheduled_tokens == {"B": 1, "A": 15, "C": 1}
    s.update_from_output(out, output_for(out))
    assert [r.request_id for r in s.running] == ["B", "A", "C"]

    # Put the victim A before the cursor: on the throttled step A (a prefill
    # chunk) is visited and skipped, then B's allocation fails and the victim
    # is A (least urgent) at index 0 < req_index. Without the cursor fix the
    # list shifts under the cursor and C is silently skipped.
    s.running = [a, b, c]
    spy = AllocationSpy(s, fail_call=1)
    out = s.schedule(throttle_prefills=True)
    assert spy.call_count == 3  # B fails, B retried, C
    assert out.preempted_req_ids == {"A"}
    assert out.num_scheduled_tokens == {"B": 1, "C": 1}  # C is not silently skipped
    assert c.status == RequestStatus.RUNNING


def _handoff(kv_role: str, defer_block_free: bool):
    s = create_scheduler(
        num_blocks=5, block_size=16, async_scheduling=True, kv_role=kv_role, defer_block_free=defer_block_free
    )
    keep, handoff = create_requests(2, num_tokens=32, max_tokens=10, req_ids=["keep", "handoff"])
    handoff.max_tokens = 1
    s.add_request(keep)
    s.add_request(handoff)
    out1 = s.schedule()
    assert out1.num_scheduled_tokens == {"keep": 32, "handoff": 32}
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    out2 = s.schedule()  # keep needs a third block: KV pressure on the tail
    return s, handoff, out1, out2


def test_mid_handoff_producer_drops_in_flight_output():
    s, handoff, out1, out2 = _handoff("kv_producer", False)
    assert out2.preempted_req_ids == {"handoff"}
    assert handoff.num_stale_output_tokens == 32 and handoff.drop_stale_output
    result = s.update_from_output(out1, output_for(out1))
    assert handoff.status == RequestStatus.PREEMPTED
    assert handoff.num_output_tokens == 0
    assert "handoff" not in [o.request_id for o in result.get(0, type("E", (), {"outputs": []})).outputs]


def test_mid_handoff_consumer_delivers_stale_output_and_finishes():
    s, handoff, out1, out2 = _handoff("kv_consumer", False)
    assert out2.preempted_req_ids == {"handoff"}
    assert not handoff.drop_stale_output
    s.update_from_output(out1, output_for(out1))
    assert handoff.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert handoff.num_output_tokens == 1
    assert handoff not in list(s.waiting)


def test_mid_handoff_consumer_with_fence_keeps_victim_running():
    s, handoff, out1, out2 = _handoff("kv_consumer", True)
    assert out2.preempted_req_ids == set()
    assert out2.total_num_scheduled_tokens == 0
    assert handoff.status == RequestStatus.RUNNING
    s.update_from_output(out1, output_for(out1))
    assert handoff.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert s.counters.num_preemptions == 0
