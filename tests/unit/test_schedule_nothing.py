"""`schedule()` with no request running or waiting takes a shortcut
(`Scheduler._schedule_nothing`, an exact fast path: engine/fast_paths.py).
A prefill node does this about once per request, while it holds a finished
prompt for the pull. Driven by hand both ways, the outputs and the
scheduler's state are the full pass's."""

from __future__ import annotations

import pytest

from engine import fast_paths
from engine.outputs import SchedulerOutput
from engine.testing import create_requests, create_scheduler

from .fence_helpers import output_for
from .test_pd_connector import kv_output


def _fields(so: SchedulerOutput) -> dict:
    cached = so.scheduled_cached_reqs
    return {
        "new": so.scheduled_new_reqs,
        "cached": (cached.req_ids, cached.resumed_req_ids, cached.new_block_ids, cached.num_computed_tokens),
        "tokens": so.num_scheduled_tokens,
        "total": so.total_num_scheduled_tokens,
        "spec": so.scheduled_spec_decode_tokens,
        "prefix": so.num_common_prefix_blocks,
        "finished": set(so.finished_req_ids),
        "preempted": set(so.preempted_req_ids),
        "seq": so.sched_step_seq,
        "step": so.step_index,
        "partial": so.partial_prefill_req_ids,
        "meta": vars(so.kv_connector_metadata) if so.kv_connector_metadata is not None else None,
    }


def _state(s) -> tuple:
    return (s.current_step, s.steady_epoch, s.prefill_capacity_bound, set(s.finished_req_ids),
            s.sched_step_seq, sorted(s.requests), s.kv_cache_manager.block_pool.get_num_free_blocks())  # fmt: skip


def _producer_holding_a_prompt_then_idle(fast: bool) -> list:
    """A producer: a prompt scheduled and finished (held for the pull), two
    idle passes, the done report, one more pass; every output and state."""
    previous = fast_paths.set_enabled(fast)
    try:
        p = create_scheduler(kv_role="kv_producer", num_blocks=50, defer_block_free=True)
        (req,) = create_requests(1, num_tokens=40, max_tokens=1)
        req.kv_transfer_params = {"do_remote_decode": True}
        p.add_request(req)
        seen = []
        out = p.schedule()
        p.update_from_output(out, output_for(out))
        for _ in range(2):  # held: running and waiting are empty
            out = p.schedule()
            seen.append((_fields(out), _state(p)))
            p.update_from_output(out, output_for(out))
        out = p.schedule()
        seen.append((_fields(out), _state(p)))
        p.update_from_output(out, kv_output(finished_sending={req.request_id}))
        out = p.schedule()  # the finished request is named once more
        seen.append((_fields(out), _state(p)))
        return seen
    finally:
        fast_paths.set_enabled(previous)


def test_an_idle_producer_schedules_exactly_as_the_full_pass_does():
    fast, plain = _producer_holding_a_prompt_then_idle(True), _producer_holding_a_prompt_then_idle(False)
    assert fast == plain
    assert [f["step"] for f, _ in fast] == [2, 3, 4, 5]
    assert all(f["total"] == 0 for f, _ in fast)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_finished_requests_ids_reach_the_next_idle_step_once(async_scheduling: bool):
    for fast in (True, False):
        previous = fast_paths.set_enabled(fast)
        try:
            s = create_scheduler(async_scheduling=async_scheduling)
            (req,) = create_requests(1, num_tokens=8, max_tokens=1)
            s.add_request(req)
            out = s.schedule()
            s.update_from_output(out, output_for(out))
            assert not s.running and not s.waiting
            idle = s.schedule()
            assert set(idle.finished_req_ids) == {req.request_id} and idle.total_num_scheduled_tokens == 0
            assert not s.finished_req_ids and s.schedule().finished_req_ids == set()
        finally:
            fast_paths.set_enabled(previous)
