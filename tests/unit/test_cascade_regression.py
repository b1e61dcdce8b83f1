"""The regression that pins PR #49675 and its pre-fix behaviour."""

import pytest

from engine.request import RequestStatus

from .fence_helpers import AllocationSpy, create_requests, fenced_scheduler, output_for


def _setup(policy: str, guard: str):
    scheduler = fenced_scheduler(policy, preemption_guard=guard)
    worst, trigger, tail = create_requests(
        3, num_tokens=33, max_tokens=10, stop_token_ids=[42], req_ids=["worst", "trigger", "tail"]
    )
    for r in (worst, trigger, tail):
        scheduler.add_request(r)
    out1 = scheduler.schedule()  # prefill
    out2 = scheduler.schedule()  # over-scheduled decode, nothing processed yet
    assert scheduler.sched_step_seq == 2 and scheduler.processed_step_seq == 0
    assert [r.last_sched_seq for r in (worst, trigger, tail)] == [2, 2, 2]
    # Priorities assigned after admission: admission order stays worst, trigger, tail.
    worst.priority, trigger.priority, tail.priority = 9, 0, 1
    return scheduler, (worst, trigger, tail), [out1, out2]


@pytest.mark.parametrize("policy,failed_call", [("fcfs", 1), ("priority", 2)])
def test_allocation_retry_waits_for_fence_then_succeeds(policy, failed_call):
    scheduler, (worst, trigger, tail), outs = _setup(policy, "fixed")
    retry_trigger = worst if policy == "fcfs" else trigger

    spy = AllocationSpy(scheduler, fail_call=failed_call)
    out3 = scheduler.schedule()
    assert spy.call_count == failed_call
    assert out3.preempted_req_ids == set()
    assert retry_trigger.request_id not in out3.num_scheduled_tokens
    assert scheduler.counters.num_preemptions == 0
    if policy == "fcfs":
        assert out3.total_num_scheduled_tokens == 0
    else:
        assert set(out3.num_scheduled_tokens) == {"worst"}  # no rollback, tail not tried
    outs.append(out3)

    for out in outs:
        scheduler.update_from_output(out, output_for(out))
    assert scheduler.processed_step_seq == scheduler.sched_step_seq

    spy.reset(failed_call)
    out4 = scheduler.schedule()
    assert spy.call_count > failed_call
    expected_victim = "worst" if policy == "priority" else "tail"
    assert out4.preempted_req_ids == {expected_victim}
    assert retry_trigger.request_id in out4.num_scheduled_tokens
    if policy == "priority":
        assert "tail" in out4.num_scheduled_tokens  # the cursor fix of PR #49206
    assert scheduler.counters.num_zero_progress_preemptions == 0


@pytest.mark.parametrize("policy,calls", [("fcfs", 3), ("priority", 4)])
def test_prefix_guard_cascades_through_fenced_victims(policy, calls):
    scheduler, (worst, trigger, tail), _ = _setup(policy, "prefix")
    free_before = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    spy = AllocationSpy(scheduler, fail_call=1 if policy == "fcfs" else 2)
    out3 = scheduler.schedule()
    assert spy.call_count == calls
    fenced_victim = "tail" if policy == "fcfs" else "worst"
    assert fenced_victim in out3.preempted_req_ids
    assert scheduler.requests[fenced_victim].status == RequestStatus.PREEMPTED
    # The victim's blocks went to deferred_frees: nothing came back to the pool.
    assert scheduler.counters.num_zero_progress_preemptions >= 1
    assert scheduler.counters.num_zero_progress_preemptions == scheduler.counters.num_preemptions
    assert len(scheduler.deferred_frees) == scheduler.counters.num_preemptions
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() <= free_before


def test_prefix_guard_matches_fix_when_fence_is_off():
    """With the fence off, the guard setting is inert."""
    from engine.testing import create_scheduler

    results = []
    for guard in ("fixed", "prefix"):
        s = create_scheduler(async_scheduling=True, defer_block_free=False, preemption_guard=guard)
        for r in create_requests(3, num_tokens=33, max_tokens=10):
            s.add_request(r)
        s.schedule()
        s.schedule()
        spy = AllocationSpy(s, fail_call=1)
        out = s.schedule()
        results.append((spy.call_count, sorted(out.preempted_req_ids), dict(out.num_scheduled_tokens)))
    assert results[0] == results[1]
    assert results[0][1] == ["2"]
