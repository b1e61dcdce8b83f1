"""Bulk steps (engine/bulk_step.py), at the scheduler: a decode-only step of a
node with several steps in flight is scheduled with the running requests in
one `BulkPart`, with the counters the plain pass writes; anything else falls
back to the plain pass before changing anything; and a node taking bulk
steps stays, event after event, in the state of one that does not."""

from __future__ import annotations

import random

import pytest

from engine import fast_paths
from engine.bulk_step import BulkPart, schedule_bulk
from engine.config import CacheConfig, SchedulerConfig
from engine.node_core import NodeCore, NodeSpec
from engine.outputs import SteadyTokens
from engine.request import Request, SamplingParams


@pytest.fixture(autouse=True)
def _fast_paths_on():
    previous = fast_paths.set_enabled(True)
    yield
    fast_paths.set_enabled(previous)


def _core(bulk: bool, **cfg) -> NodeCore:
    spec = NodeSpec(
        name="n",
        kv_role=cfg.get("kv_role"),
        scheduler=SchedulerConfig(
            max_num_seqs=cfg.get("max_num_seqs", 32),
            max_num_batched_tokens=cfg.get("max_num_batched_tokens", 2048),
            max_model_len=cfg.get("max_model_len", 512),
            long_prefill_token_threshold=cfg.get("long_prefill_token_threshold", 0),
            policy=cfg.get("policy", "fcfs"),
            async_scheduling=cfg.get("async_scheduling", True),
        ),
        cache=CacheConfig(
            num_gpu_blocks=cfg.get("num_gpu_blocks", 200),
            block_size=cfg.get("block_size", 4),
            enable_prefix_caching=cfg.get("enable_prefix_caching", False),
        ),
        pipeline_parallel_size=cfg.get("pp", 1),
        stop_probability=cfg.get("stop_probability", 0.0),
        shadow_kv=cfg.get("shadow_kv", True),
    )
    core = NodeCore(spec)
    core.scheduler.bulk_token_outputs = True  # as the in-process runtime sets it for a batch run
    core.scheduler.sampler = core.sampler if bulk else None
    return core


def _request(rid: str, prompt_len: int, max_tokens: int, **params) -> Request:
    return Request(rid, list(range(3, 3 + prompt_len)), SamplingParams(max_tokens=max_tokens, **params), eos_token_id=2)


def test_a_decode_step_is_scheduled_in_bulk() -> None:
    core = _core(True)
    s = core.scheduler
    for i in range(3):
        core.add_request(_request(f"r{i}", 6, 5))
    first = core.schedule_step(0.0)  # the prompts: a plain step (nobody runs yet)
    assert first is not None and first.scheduler_output.steady is None
    second = core.schedule_step(0.0)  # async: built while the first is in flight
    assert second is not None
    so = second.scheduler_output
    part = so.steady
    assert type(part) is BulkPart
    assert [r.request_id for r in part.members] == ["r0", "r1", "r2"]
    assert part.starts == [6, 6, 6]
    assert so.num_scheduled_tokens == {} and so.total_num_scheduled_tokens == 3
    # Two steps in flight: a placeholder each, and their tokens (6 of the prompt, 1 decode) in flight.
    for r in s.running:
        assert (r.num_computed_tokens, r.num_tokens, r.num_output_placeholders, r.num_in_flight_tokens) == (7, 6, 2, 7)
    # 7 tokens fit the two blocks of 4 the prompt took: no new block, the call counted all the same.
    assert part.new_blocks == []
    assert s.kv_cache_manager.num_allocate_slots_calls == 6
    assert second.shape.decode_tokens == 3 and second.shape.batch_size == 3
    # The first step's update gives each its first token; the second's, as one SteadyTokens.
    core.process_oldest(core.finish_step(first, 0.1))
    outputs = core.process_oldest(core.finish_step(second, 0.2))
    assert len(outputs) == 1 and type(outputs[0]) is SteadyTokens
    assert outputs[0].request_ids == ["r0", "r1", "r2"]
    assert [len(r.output_token_ids) for r in s.running] == [2, 2, 2]


def test_anything_else_falls_back_to_the_plain_pass_unchanged() -> None:
    """A prefill chunk among the running requests, or a pool too small for
    the step's blocks: None, and nothing changed."""
    chunked = _core(True, max_num_batched_tokens=8, async_scheduling=False)
    chunked.add_request(_request("long", 20, 5))
    assert chunked.schedule_step(0.0) is not None  # 8 of its 20 prompt tokens
    chunked.process_oldest(chunked.finish_step(chunked.oldest(), 0.1))  # type: ignore[arg-type]
    s = chunked.scheduler
    before = (s.current_step, s.kv_cache_manager.num_allocate_slots_calls, s.running[0].num_computed_tokens)
    assert schedule_bulk(s, chunked.sampler) is None
    assert (s.current_step, s.kv_cache_manager.num_allocate_slots_calls, s.running[0].num_computed_tokens) == before

    full = _core(True, num_gpu_blocks=5, block_size=4)  # 4 usable blocks
    for i in range(2):
        full.add_request(_request(f"r{i}", 8, 20))  # two blocks each: the pool is full
    first = full.schedule_step(0.0)
    assert first is not None
    s = full.scheduler
    calls = s.kv_cache_manager.num_allocate_slots_calls
    assert schedule_bulk(s, full.sampler) is None  # both need a third block
    assert s.kv_cache_manager.num_allocate_slots_calls == calls and s.current_step == 1


def _state(core: NodeCore, requests: list[Request]) -> dict:
    s = core.scheduler
    kvm = s.kv_cache_manager
    return {
        "requests": [
            (
                r.request_id,
                r.status,
                r.num_computed_tokens,
                r.num_tokens,
                list(r.output_token_ids),
                r.num_output_placeholders,
                r.num_in_flight_tokens,
                r.num_stale_output_tokens,
                r.last_sched_seq,
                r.is_prefill_chunk,
                r.stop_reason,
                r.num_preemptions,
            )
            for r in requests
        ],  # fmt: skip
        "queues": ([r.request_id for r in s.running], [r.request_id for r in s.waiting]),
        "fence": (s.sched_step_seq, s.processed_step_seq, len(s.deferred_frees)),
        "counters": s.get_counters(),
        "blocks": {rid: [b.block_id for b in bl] for rid, bl in kvm.req_to_blocks.items()},
        "cached": dict(kvm.num_cached_block),
        "free": [b.block_id for b in kvm.block_pool.free_block_queue],
        "tables": {rid: list(st.block_ids) for rid, st in core.runner.requests.items()},
        "shadow": (core.shadow.summary() if core.shadow is not None else None),
        "records": [rec.to_dict() for rec in core.engine.step_records],
    }


def _outputs(outputs) -> list:
    return [
        ("tokens", tuple(o.request_ids))
        if type(o) is SteadyTokens
        else (o.request_id, tuple(o.new_token_ids), o.finish_reason, o.num_preemptions)
        for o in outputs
    ]


def _one_token_outputs_in_bulk(outputs) -> list:
    """The plain path's outputs, with its one-token non-finishing ones named
    in one SteadyTokens first, as a bulk step's update orders them."""
    flat = _outputs(outputs)
    ids = [rid for kind, rids in (x for x in flat if x[0] == "tokens") for rid in rids]  # type: ignore[misc]
    rest = [x for x in flat if x[0] != "tokens"]
    return ([("tokens", tuple(ids))] if ids else []) + rest


@pytest.mark.parametrize("seed", range(10))
def test_bulk_and_plain_nodes_stay_in_lockstep(seed: int) -> None:
    """The same random script (arrivals, aborts, steps scheduled and
    completed in any interleaving the batch queue allows) on a node that
    takes bulk steps and one that does not: the same state after every event."""
    rng = random.Random(seed)
    cfg = {
        "async_scheduling": rng.random() < 0.7,
        "pp": rng.choice([1, 2, 3]),
        "num_gpu_blocks": rng.choice([24, 60, 400]),
        "block_size": rng.choice([2, 4, 16]),
        "max_num_seqs": rng.choice([4, 16]),
        "max_model_len": rng.choice([96, 512]),
        "enable_prefix_caching": rng.random() < 0.5,
        "policy": rng.choice(["fcfs", "priority"]),
        "stop_probability": rng.choice([0.0, 0.05]),
    }
    plain, bulk = _core(False, **cfg), _core(True, **cfg)
    requests: dict[NodeCore, list[Request]] = {plain: [], bulk: []}
    taken = 0
    for event in range(300):
        now = event * 0.001
        roll = rng.random()
        if roll < 0.1:
            rid, prompt_len, max_tokens = f"r{event}", rng.randint(1, 60), rng.randint(1, 60)
            priority, min_tokens = rng.randint(0, 2), rng.choice([0, 0, 5])
            for core in (plain, bulk):
                r = _request(rid, prompt_len, max_tokens, min_tokens=min_tokens)
                r.priority = priority
                core.add_request(r)
                requests[core].append(r)
        elif roll < 0.13 and requests[plain]:
            rid = rng.choice(requests[plain]).request_id
            plain.abort_requests([rid])
            bulk.abort_requests([rid])
        elif roll < 0.6:
            a, b = plain.schedule_step(now), bulk.schedule_step(now)
            assert (a is None) == (b is None)
            if b is not None:
                taken += type(b.scheduler_output.steady) is BulkPart
                assert a.shape == b.shape  # type: ignore[union-attr]
        else:
            a, b = plain.oldest(), bulk.oldest()
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                out_a = plain.process_oldest(plain.finish_step(a, now))
                out_b = bulk.process_oldest(bulk.finish_step(b, now))
                assert _one_token_outputs_in_bulk(out_a) == _outputs(out_b)
        assert _state(plain, requests[plain]) == _state(bulk, requests[bulk]), f"event {event}"
    assert taken > 0
