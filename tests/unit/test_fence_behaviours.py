"""v1 §7 of the behaviour reference (docs/reference.md): the checkable
behaviours of the deferred-free fence, each driven by hand."""

import pytest

from engine.free_path import drain_deferred_frees
from engine.request import RequestStatus
from engine.testing import create_requests, create_scheduler

from .fence_helpers import fenced_scheduler, output_for


def free_blocks(s):
    return s.kv_cache_manager.block_pool.get_num_free_blocks()


@pytest.mark.parametrize(
    "kv_role,async_scheduling,expected",
    [
        ("kv_consumer", True, True),
        ("kv_both", True, True),
        ("kv_producer", True, False),
        (None, True, False),
        ("kv_consumer", False, False),
    ],
)
def test_1_gate(kv_role, async_scheduling, expected):
    s = create_scheduler(kv_role=kv_role, async_scheduling=async_scheduling)
    assert s.defer_block_free is expected


def test_1_gate_pipeline_parallel_depth():
    s = create_scheduler(kv_role="kv_consumer", pipeline_parallel_size=2)
    assert s.defer_block_free is True


def test_2_empty_steps_move_no_counter():
    s = fenced_scheduler()
    out = s.schedule()
    assert out.total_num_scheduled_tokens == 0
    s.update_from_output(out, output_for(out))
    assert (s.sched_step_seq, s.processed_step_seq) == (0, 0)


def test_3_stop_token_finish_defers_until_inflight_step_done():
    s = fenced_scheduler(num_blocks=100)
    (req,) = create_requests(1, num_tokens=16, max_tokens=10, stop_token_ids=[42])
    s.add_request(req)
    out1 = s.schedule()
    s.update_from_output(out1, output_for(out1))
    out2 = s.schedule()  # step 2: decode
    out3 = s.schedule()  # step 3: over-scheduled decode, in flight
    before = free_blocks(s)
    s.update_from_output(out2, output_for(out2, token_id=42))  # stops in step 2's output
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert req.request_id not in s.requests  # bookkeeping gone at once
    assert [fence for fence, _ in s.deferred_frees] == [3]
    assert free_blocks(s) == before
    s.update_from_output(out3, output_for(out3))
    assert not s.deferred_frees and free_blocks(s) == 99


def test_4_max_tokens_finish_frees_immediately_with_other_inflight():
    s = fenced_scheduler(num_blocks=100)
    a, b = create_requests(2, num_tokens=16, max_tokens=2)
    b.max_tokens = 50
    s.add_request(a)
    s.add_request(b)
    out1 = s.schedule()
    out2 = s.schedule()  # yields a's second (last) token
    s.update_from_output(out1, output_for(out1))
    out3 = s.schedule()  # async guard: a is not scheduled again
    assert "0" not in out3.num_scheduled_tokens and "1" in out3.num_scheduled_tokens
    s.update_from_output(out2, output_for(out2))
    assert a.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert not s.deferred_frees  # freed at once although step 3 is in flight


def test_5_abort_fence_held_across_multiple_inflight_steps():
    s = fenced_scheduler(num_blocks=100)
    s.max_num_scheduled_tokens = 8192
    (req,) = create_requests(1, num_tokens=16, max_tokens=50)
    s.add_request(req)
    outs = [s.schedule() for _ in range(3)]
    s.finish_requests([req.request_id], RequestStatus.FINISHED_ABORTED)
    assert [f for f, _ in s.deferred_frees] == [3]
    s.update_from_output(outs[0], output_for(outs[0]))
    s.update_from_output(outs[1], output_for(outs[1]))
    assert s.deferred_frees and free_blocks(s) < 99
    s.update_from_output(outs[2], output_for(outs[2]))
    assert not s.deferred_frees and free_blocks(s) == 99


def test_6_depth_one_frees_immediately_even_with_gate_forced():
    s = create_scheduler(defer_block_free=True, num_blocks=100)
    (req,) = create_requests(1, num_tokens=16, max_tokens=10, stop_token_ids=[42])
    s.add_request(req)
    out = s.schedule()
    s.update_from_output(out, output_for(out))
    out = s.schedule()
    s.update_from_output(out, output_for(out, token_id=42))
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert not s.deferred_frees and free_blocks(s) == 99


def test_7_preempt_defers_free_and_clears_bookkeeping():
    s = fenced_scheduler(num_blocks=100, preemption_guard="prefix")
    (req,) = create_requests(1, num_tokens=32, max_tokens=10)
    s.add_request(req)
    s.schedule()
    before = free_blocks(s)
    s.running.remove(req)
    s._preempt_request(req)
    assert req.request_id not in s.kv_cache_manager.req_to_blocks
    assert free_blocks(s) == before
    assert s.counters.num_zero_progress_preemptions == 1


def test_8_two_finishes_in_one_output_share_a_fence():
    s = fenced_scheduler(num_blocks=100)
    reqs = create_requests(2, num_tokens=16, max_tokens=10, stop_token_ids=[42])
    for r in reqs:
        s.add_request(r)
    out1 = s.schedule()
    s.update_from_output(out1, output_for(out1))
    out2 = s.schedule()
    out3 = s.schedule()
    s.update_from_output(out2, output_for(out2, token_id=42))
    assert [f for f, _ in s.deferred_frees] == [3, 3]
    s.update_from_output(out3, output_for(out3))
    assert not s.deferred_frees and free_blocks(s) == 99


def test_9_drain_stops_at_first_unsatisfied_fence():
    s = fenced_scheduler(num_blocks=10)
    pool = s.kv_cache_manager.block_pool
    b1, b2 = pool.get_new_blocks(2)
    s.deferred_frees.extend([(2, [b1]), (1, [b2])])
    s.sched_step_seq = 2
    s.processed_step_seq = 1
    drain_deferred_frees(s)
    assert len(s.deferred_frees) == 2
    s.processed_step_seq = 2
    drain_deferred_frees(s)
    assert not s.deferred_frees and pool.get_num_free_blocks() == 9


def _tight_running_pair(policy="fcfs", guard="fixed"):
    # 4 usable blocks of 16: two 32-token prompts fill the pool.
    s = fenced_scheduler(policy, num_blocks=5, preemption_guard=guard)
    reqs = create_requests(2, num_tokens=32, max_tokens=10)
    for r in reqs:
        s.add_request(r)
    return s, reqs


def test_10_fcfs_fenced_tail_stops_retry_without_preemption():
    s, (a, b) = _tight_running_pair()
    out1 = s.schedule()
    assert out1.num_scheduled_tokens == {"0": 32, "1": 32}
    out2 = s.schedule()  # both need a 3rd block; b (tail) is fenced
    assert out2.total_num_scheduled_tokens == 0
    assert out2.preempted_req_ids == set()
    assert a.status == b.status == RequestStatus.RUNNING
    assert s.counters.num_fence_stopped_retries == 1


def test_13_phase_two_preempts_the_tail_after_the_fence_passes():
    s, (a, b) = _tight_running_pair()
    out1 = s.schedule()
    out2 = s.schedule()  # empty, blocked by the fence
    s.update_from_output(out1, output_for(out1))
    s.update_from_output(out2, output_for(out2))
    out3 = s.schedule()
    assert out3.preempted_req_ids == {"1"}
    assert out3.num_scheduled_tokens == {"0": 1}
    assert s.counters.num_zero_progress_preemptions == 0


def test_14_a_step_with_a_preemption_admits_no_waiting_request():
    s = create_scheduler(num_blocks=5, max_num_seqs=8)
    a, b = create_requests(2, num_tokens=32, max_tokens=10)
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    s.update_from_output(out, output_for(out))
    (small,) = create_requests(1, num_tokens=1, max_tokens=10, req_ids=["small"])
    s.add_request(small)
    out = s.schedule()
    assert out.preempted_req_ids == {"1"}
    assert "small" not in out.num_scheduled_tokens


def test_15_fence_stopped_retry_still_runs_waiting_loop():
    s, (a, b) = _tight_running_pair()
    s.schedule()
    (small,) = create_requests(1, num_tokens=1, max_tokens=10, req_ids=["small"])
    s.add_request(small)
    # No free block left: the waiting request cannot be admitted, but the
    # loop did run: it tried (and failed) an allocation for it.
    calls = s.kv_cache_manager.num_allocate_slots_calls
    out = s.schedule()
    assert out.preempted_req_ids == set()
    assert s.kv_cache_manager.num_allocate_slots_calls == calls + 2


def test_17_priority_self_preemption_continues_the_pass():
    s = create_scheduler(num_blocks=7, policy="priority")
    reqs = create_requests(3, num_tokens=32, max_tokens=10, priorities=[0, 9, 1])
    for r in reqs:
        s.add_request(r)
    out = s.schedule()
    assert out.num_scheduled_tokens == {"0": 32, "1": 32, "2": 32}
    s.update_from_output(out, output_for(out))
    out = s.schedule()
    # "0" takes the last free block; "1" (least urgent) fails, preempts itself; "2" still runs.
    assert out.preempted_req_ids == {"1"}
    assert set(out.num_scheduled_tokens) == {"0", "2"}


def test_17_fcfs_tail_self_preemption_ends_the_pass():
    s = create_scheduler(num_blocks=7)
    reqs = create_requests(3, num_tokens=32, max_tokens=10)
    for r in reqs:
        s.add_request(r)
    out = s.schedule()
    s.update_from_output(out, output_for(out))
    out = s.schedule()
    # "0" takes the last block, "1" preempts the tail "2" and is scheduled.
    assert out.preempted_req_ids == {"2"}
    assert set(out.num_scheduled_tokens) == {"0", "1"}


def test_20_waiting_allocation_failure_blocks_the_queue_head():
    s = create_scheduler(num_blocks=5, max_num_seqs=8)
    (big,) = create_requests(1, num_tokens=80, max_tokens=10, req_ids=["big"])
    (small,) = create_requests(1, num_tokens=1, max_tokens=10, req_ids=["small"])
    s.add_request(big)
    s.add_request(small)
    out = s.schedule()
    assert out.total_num_scheduled_tokens == 0  # small fits, but is behind big


def test_24_async_placeholders_rise_and_reset_on_preemption():
    s = fenced_scheduler(num_blocks=100, preemption_guard="prefix")
    (req,) = create_requests(1, num_tokens=16, max_tokens=50)
    s.add_request(req)
    outs = [s.schedule() for _ in range(3)]
    assert req.num_output_placeholders == 3
    s.update_from_output(outs[0], output_for(outs[0]))
    assert req.num_output_placeholders == 2
    s.running.remove(req)
    s._preempt_request(req)
    assert req.num_output_placeholders == 0 and req.num_computed_tokens == 0


def test_25_active_cap_blocks_even_completed_async_loads():
    s = create_scheduler(kv_role="kv_consumer", max_num_seqs=1, num_blocks=100)
    a, b = create_requests(2, num_tokens=32, max_tokens=5)
    b.kv_transfer_params = {"do_remote_prefill": True, "remote_block_ids": [1, 2]}
    s.add_request(a)
    s.schedule()  # a admitted, running cap reached
    s.add_request(b)
    s.schedule()
    assert b.status == RequestStatus.WAITING  # the cap is checked before the head
