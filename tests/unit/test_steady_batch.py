"""Recognising steady decode (engine/steady_decode.py, `steady_batch`) and
the cohort it keeps from step to step (engine/steady_cohort.py): what it
reads of the running batch, when it is kept, extended or built again."""

from __future__ import annotations

import pytest

import engine.steady_cohort as steady_cohort
from engine.config import CacheConfig, SchedulerConfig
from engine.deferred_hashes import PENDING
from engine.node_core import NodeCore, NodeSpec
from engine.steady_decode import block_plan, steady_batch
from engine.steady_step import schedule_with_steady
from engine.testing import create_requests


def _core_in_steady_decode(
    n: int = 3, prompt: int | list[int] = 20, max_tokens: int = 50, caching: bool = False
) -> NodeCore:
    core = NodeCore(
        NodeSpec(
            "n",
            None,
            scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512),
            cache=CacheConfig(num_gpu_blocks=100, block_size=16, enable_prefix_caching=caching),
            shadow_kv=False,
        )
    )
    lengths = prompt if isinstance(prompt, list) else [prompt] * n
    prompts = [[1000 * i + t for t in range(length)] for i, length in enumerate(lengths)]
    for r in create_requests(n, max_tokens=max_tokens, ignore_eos=True, prompt_token_ids=prompts):
        core.add_request(r)
    for t in range(2):  # the prefill, then one decode step: every request now decodes one token a step
        plan = core.schedule_step(float(t))
        assert plan is not None
        core.process_oldest(core.finish_step(plan, float(t)))
    return core


def _admission_step(core: NodeCore, now: float) -> None:
    """One step that admits the waiting requests next to the steady ones, as the fast-forward takes it."""
    batch = steady_batch(core, admitting=True)
    assert batch is not None
    per_step, _, fits = block_plan(core, batch, 1)
    assert fits == 1
    plan = core.engine.queue_step(now, schedule_with_steady(core, batch, per_step))
    core.process_oldest(core.finish_step(plan, now))


def test_the_batch_carries_what_every_later_pass_reads():
    core = _core_in_steady_decode()
    batch = steady_batch(core)
    assert batch is not None
    running = core.scheduler.running
    assert batch.requests == running and batch.ids == [r.request_id for r in running]
    # 20 prompt tokens + 2 outputs: 21 computed, 2 outputs so far, 48 steps to go.
    assert batch.context == 63 and batch.finish_step == [48, 48, 48]
    # 2 blocks of 16 hold 21 computed tokens; step j needs 21 + j slots: a block at step 12, then every 16.
    assert batch.block_due == [12, 12, 12]
    per_step, finishing, fits = block_plan(core, batch, 30)
    assert per_step[12] == running and per_step[28] == running and fits == 30
    assert [j for j in range(31) if per_step[j]] == [12, 28]
    assert not any(finishing)
    assert [shape.context_tokens for _, shape in zip(range(3), batch.shapes())] == [66, 69, 72]


def test_the_cohort_is_kept_across_steady_steps_and_built_again_after_a_plain_one():
    core = _core_in_steady_decode()
    s = core.scheduler
    first = steady_batch(core)
    assert first is not None and steady_batch(core).cohort is first.cohort
    # A steady admission step (nothing waits) keeps it; its members are a step further.
    _admission_step(core, 2.0)
    again = steady_batch(core)
    assert again.cohort is first.cohort and again.finish_step == [47, 47, 47] and again.block_due == [11, 11, 11]
    # A plain step starts a new scheduler epoch: the cohort is built again.
    plan = core.schedule_step(3.0)
    assert plan is not None
    core.process_oldest(core.finish_step(plan, 3.0))
    rebuilt = steady_batch(core)
    assert rebuilt.cohort is not first.cohort and rebuilt.finish_step == [46, 46, 46]
    # Built again, every request is checked again.
    plan = core.schedule_step(4.0)
    core.process_oldest(core.finish_step(plan, 4.0))
    s.running[1].sampling_params.stop_token_ids = [7]  # it could now stop on a sampled token
    assert steady_batch(core) is None
    s.running[1].sampling_params.stop_token_ids = []
    assert steady_batch(core) is not None


def test_admitted_requests_join_at_the_end_and_finished_ones_leave():
    core = _core_in_steady_decode(n=2, max_tokens=4)  # 2 outputs so far: 2 steps to go
    cohort = steady_batch(core).cohort
    (late,) = create_requests(1, num_tokens=20, max_tokens=30, ignore_eos=True, req_ids=["late"])
    core.add_request(late)
    _admission_step(core, 2.0)  # the two decode their third token; the new one is prefilled
    batch = steady_batch(core)
    assert batch.cohort is cohort and batch.requests == core.scheduler.running
    assert [r.request_id for r in batch.requests] == ["0", "1", late.request_id]
    assert batch.finish_step == [1, 1, 29]
    _admission_step(core, 3.0)  # nothing waits: the two reach their cap and leave
    batch = steady_batch(core)
    assert batch.cohort is cohort and batch.ids == [late.request_id] and batch.finish_step == [28]
    assert list(cohort.by_finish) == [late.steady_finish]


def test_a_change_outside_the_steady_paths_is_caught_by_the_cohort_check(monkeypatch):
    monkeypatch.setattr(steady_cohort, "CHECK", True)
    core = _core_in_steady_decode()
    assert steady_batch(core) is not None
    r = core.scheduler.running[0]
    r.num_computed_tokens -= 1  # a token to catch up on: not one-token-a-step decode
    with pytest.raises(AssertionError, match="no longer in steady decode"):
        steady_batch(core)
    core.scheduler.steady_epoch += 1  # as a plain step would: the cohort is built again
    assert steady_batch(core) is None


def test_a_request_holding_a_spare_block_takes_its_next_one_a_block_later():
    core = _core_in_steady_decode()
    s = core.scheduler
    kvm = s.kv_cache_manager
    r = s.running[0]
    (spare,) = kvm.block_pool.get_new_blocks(1)
    kvm.req_to_blocks[r.request_id].append(spare)
    core.runner.requests[r.request_id].block_ids.append(spare.block_id)
    s.steady_epoch += 1  # as after the plain step that would have given it
    batch = steady_batch(core)
    assert batch.block_due == [28, 12, 12]
    per_step, _, _ = block_plan(core, batch, 30)
    assert per_step[12] == s.running[1:] and per_step[28] == s.running


def _counters(r) -> tuple:
    return (r.num_computed_tokens, r.num_tokens, r.num_in_flight_tokens, len(r._output_token_ids), r.last_sched_seq)


def test_an_abort_while_a_steady_step_is_in_flight_leaves_every_request_as_the_plain_path_does():
    """The steady paths write their members' counters lazily (`SteadyCohort.settle`): an abort
    applied before the in-flight step's update settles them, the aborted request keeps what
    its abort left (its token still in flight), the others get the step's token."""
    cores = []
    for steady in (False, True):
        core = _core_in_steady_decode()
        (late,) = create_requests(1, num_tokens=20, max_tokens=30, ignore_eos=True, req_ids=["late"])
        core.add_request(late)
        if steady:
            batch = steady_batch(core, admitting=True)
            per_step, _, _ = block_plan(core, batch, 1)
            plan = core.engine.queue_step(2.0, schedule_with_steady(core, batch, per_step))
        else:
            plan = core.schedule_step(2.0)
        aborted = core.scheduler.running[0]
        core.abort_requests([aborted.request_id])  # the step is in flight: applied before its update
        core.process_oldest(core.finish_step(plan, 2.0))
        plan = core.schedule_step(3.0)  # a plain step reads every counter
        core.process_oldest(core.finish_step(plan, 3.0))
        cores.append((aborted, list(core.scheduler.running)))
    (plain_aborted, plain_running), (fast_aborted, fast_running) = cores
    assert fast_aborted.is_finished() and _counters(fast_aborted) == _counters(plain_aborted)
    assert [_counters(r) for r in fast_running] == [_counters(r) for r in plain_running]


def test_with_prefix_caching_a_member_caches_a_block_the_step_before_it_takes_the_next(monkeypatch):
    """Prompts of 20, 27 and 30 tokens, one decode step done: 21, 28 and 31
    tokens computed, one block of 16 cached each. A step computes one more
    token each; `allocate_slots` caches a block when that fills it (32
    tokens) and takes the next one the step after."""
    core = _core_in_steady_decode(prompt=[20, 27, 30], caching=True)
    s = core.scheduler
    kvm = s.kv_cache_manager
    batch = steady_batch(core)
    assert batch is not None
    assert [kvm.num_cached_block[r.request_id] for r in batch.requests] == [1, 1, 1]
    now, cohort = s.current_step, batch.cohort
    assert [[r.request_id for r in cohort.cachers(now + j, set())] for j in (1, 4, 11)] == [["2"], ["1"], ["0"]]
    per_step, _, _ = block_plan(core, batch, 12)
    assert [[r.request_id for r in per_step[j]] for j in (2, 5, 12)] == [["2"], ["1"], ["0"]]
    # One steady step: request "2" fills its second block, which is then cached under its hash.
    _admission_step(core, 10.0)
    r2 = s.requests["2"]
    assert kvm.num_cached_block["2"] == 2 and [kvm.num_cached_block[i] for i in "01"] == [1, 1]
    # Its hash covers prompt tokens 16..29 and the two sampled outputs, which
    # the lazy counters have not written: the sampler's ids at 30 and 31.
    outputs = (core.sampler.token_at("2", 30), core.sampler.token_at("2", 31))
    expected = hash((r2.block_hashes[0], (tuple(r2.prompt_token_ids[16:30]), outputs)))
    block = kvm.req_to_blocks["2"][1]
    # The steady path defers that hash (engine/deferred_hashes.py): the block
    # is cached (it would go to the free queue's tail) but not hashed yet.
    pool = kvm.block_pool
    assert block.block_hash == PENDING and len(r2.block_hashes) == 1 and len(pool.deferred) == 1
    assert expected not in pool.cached_block_hash_to_block
    # A lookup through its parent (the prompt's block) works it out first.
    assert pool.get_cached_prefix([r2.block_hashes[0], expected]) == kvm.req_to_blocks["2"][:2]
    assert r2.block_hashes[1] == expected == block.block_hash and len(pool.deferred) == 0
    assert kvm.block_pool.get_cached_block(expected) is block
    monkeypatch.setattr(steady_cohort, "CHECK", True)  # the cohort check also checks the cached counts
    assert steady_batch(core) is not None
