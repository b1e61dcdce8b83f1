"""The engine loop's batch queue: vLLM's `step_with_batch_queue` order."""

from engine.engine_core import EngineCore
from engine.model_runner import SimModelRunner
from engine.sampler import DeterministicSampler
from engine.testing import create_requests, create_scheduler


def make_core(depth: int, **kw) -> EngineCore:
    s = create_scheduler(async_scheduling=depth > 1, **kw)
    return EngineCore("n", s, SimModelRunner(DeterministicSampler(0)), depth)


def test_depth_two_schedules_next_step_before_processing_the_first():
    core = make_core(2, num_blocks=100)
    for r in create_requests(2, num_tokens=16, max_tokens=5, ignore_eos=True):
        core.add_request(r)
    p1 = core.schedule_step(0.0)
    p2 = core.schedule_step(0.0)
    assert p1 is not None and p2 is not None
    assert core.schedule_step(0.0) is None  # queue full: wait for the oldest
    assert core.scheduler.sched_step_seq == 0  # fence gate off: no consumer
    assert core.oldest() is p1
    core.process_oldest(core.runner.finish_step(p1, 1.0))
    assert core.oldest() is p2
    p3 = core.schedule_step(1.0)
    assert p3 is not None and list(core.batch_queue) == [p2, p3]


def test_depth_one_is_schedule_execute_update():
    core = make_core(1, num_blocks=100)
    (r,) = create_requests(1, num_tokens=16, max_tokens=3, ignore_eos=True)
    core.add_request(r)
    steps = 0
    while (plan := core.schedule_step(float(steps))) is not None:
        assert len(core.batch_queue) == 1
        assert core.schedule_step(float(steps)) is None  # depth 1: one step at a time
        core.process_oldest(core.runner.finish_step(plan, float(steps)))
        steps += 1
    assert steps == 3 and r.num_output_tokens == 3
    # The finish is published by one more (empty, dropped) schedule; then idle.
    assert not core.has_work()


def test_empty_step_is_dropped_when_idle_but_queued_behind_work():
    core = make_core(2, num_blocks=5, kv_role="kv_consumer", defer_block_free=True)
    a, b = create_requests(2, num_tokens=32, max_tokens=10)
    core.add_request(a)
    core.add_request(b)
    p1 = core.schedule_step(0.0)  # both prefill: the pool is full
    p2 = core.schedule_step(0.0)  # needs a block, the tail is fenced: empty, but queued
    assert p2 is not None and p2.scheduler_output.total_num_scheduled_tokens == 0
    assert list(core.batch_queue) == [p1, p2]


def test_nothing_scheduled_without_requests():
    core = make_core(2)
    assert core.schedule_step(0.0) is None
    assert not core.has_work()


def test_aborts_wait_for_the_next_output():
    core = make_core(2, num_blocks=100)
    (r,) = create_requests(1, num_tokens=16, max_tokens=50, ignore_eos=True)
    core.add_request(r)
    p1 = core.schedule_step(0.0)
    core.abort_requests([r.request_id])
    assert r.request_id in core.scheduler.requests  # not yet
    core.process_oldest(core.runner.finish_step(p1, 1.0))
    assert r.is_finished() and r.status.name == "FINISHED_ABORTED"


def _shadow_core(depth: int) -> EngineCore:
    from engine.shadow_kv import ShadowKVStore

    s = create_scheduler(async_scheduling=depth > 1, num_blocks=100)
    runner = SimModelRunner(DeterministicSampler(0), ShadowKVStore(100, 16), retire_finished=True)
    return EngineCore("n", s, runner, depth)


def test_a_finished_request_is_retired_only_when_no_step_in_flight_includes_it():
    core = _shadow_core(2)
    shadow = core.runner.shadow
    (r,) = create_requests(1, num_tokens=16, max_tokens=2, ignore_eos=True)
    (other,) = create_requests(1, num_tokens=16, max_tokens=50, ignore_eos=True, req_ids=["long"])
    core.add_request(r)
    core.add_request(other)  # keeps steps coming after r's finish
    t = 0.0
    while r.request_id not in core.scheduler.finished_req_ids:
        if not core.queue_full and (plan := core.schedule_step(t)) is not None:
            continue  # keep the queue full
        core.process_oldest(core.runner.finish_step(core.oldest(), t))
        t += 1.0
    # The step after the one that finished it was scheduled before its finish:
    # it is in flight, so the next step that names the finish cannot retire it yet.
    in_flight = list(core.batch_queue)
    assert in_flight
    named = core.schedule_step(t)
    assert named is not None and r.request_id in named.scheduler_output.finished_req_ids
    assert r.request_id not in shadow._retired
    for plan in in_flight:
        core.process_oldest(core.runner.finish_step(plan, t))
    assert r.request_id in shadow._retired


def test_without_a_step_in_flight_the_finish_retires_at_once_and_a_producer_never_retires():
    core = _shadow_core(1)
    (r,) = create_requests(1, num_tokens=16, max_tokens=1, ignore_eos=True)
    core.add_request(r)
    plan = core.schedule_step(0.0)
    core.process_oldest(core.runner.finish_step(plan, 0.0))
    core.schedule_step(1.0)  # names the finish; nothing is in flight
    assert r.request_id in core.runner.shadow._retired
    from engine.shadow_kv import ShadowKVStore

    producer = SimModelRunner(DeterministicSampler(0), ShadowKVStore(100, 16), retire_finished=False)
    producer.retire("x")
    assert not producer.retires and "x" not in producer.shadow._retired  # a pull may still read its blocks
