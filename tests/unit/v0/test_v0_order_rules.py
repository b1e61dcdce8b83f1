"""The six order rules of vLLM 0.5.3.post1's v0 scheduler, each pinned by a
hand-driven scenario (docs/reference.md, "v0: The six order rules")."""

import logging

import pytest

from engine.v0 import CacheConfig, Scheduler, SchedulerConfig, SequenceStatus
from engine.v0.testing import engine_step, ids, make_seq_group


def make_scheduler(
    num_gpu_blocks,
    block_size=16,
    num_cpu_blocks=0,
    max_model_len=256,
    max_num_batched_tokens=None,
    max_num_seqs=8,
    chunked=False,
    preemption_mode=None,
):
    return Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=chunked,
            preemption_mode=preemption_mode,
        ),
        CacheConfig(num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks, block_size=block_size),
    )


# Rule 1 -----------------------------------------------------------------------
def test_rule1_new_requests_are_appended_to_waiting_and_served_fifo():
    s = make_scheduler(100, max_num_seqs=2)
    # Arrival times deliberately out of order: waiting is never sorted.
    for rid, arrival in (("x", 5.0), ("y", 1.0), ("z", 0.0)):
        s.add_seq_group(make_seq_group(rid, 8, arrival_time=arrival))
    assert ids(s.waiting) == ["x", "y", "z"]
    step = engine_step(s)
    assert step.prefills == [("x", 8), ("y", 8)]
    assert ids(s.waiting) == ["z"]
    assert ids(s.running) == ["x", "y"]


# Rule 2 -----------------------------------------------------------------------
def test_rule2_head_that_cannot_allocate_stops_the_prefill_phase():
    s = make_scheduler(10)  # 10 blocks of 16 tokens
    s.add_seq_group(make_seq_group("big", 100, max_tokens=30, arrival_time=0))  # 7 blocks
    assert engine_step(s).prefills == [("big", 100)]
    s.add_seq_group(make_seq_group("long", 100, arrival_time=1))  # 7 blocks: only 3 free -> LATER
    s.add_seq_group(make_seq_group("short", 8, arrival_time=2))  # 1 block: would fit
    step = engine_step(s, now=1)
    assert step.prefills == []  # short is skipped although it fits
    assert step.decodes == ["big"]
    assert ids(s.waiting) == ["long", "short"]
    c = s.starvation
    assert (c.head_of_line_events, c.head_of_line_bypassable, c.head_of_line_alloc_later, c.head_of_line_budget) == (
        1,
        1,
        1,
        0,
    )
    assert c.head_of_line_blockers == {"long": 1}


def test_rule2_head_that_exceeds_the_token_budget_stops_the_prefill_phase():
    s = make_scheduler(100, max_model_len=64, max_num_batched_tokens=64)
    for rid, n in (("a", 40), ("b", 40), ("c", 10)):
        s.add_seq_group(make_seq_group(rid, n))
    step = engine_step(s)
    assert step.prefills == [("a", 40)]  # b: 40 + 40 > 64 -> break; c (50 <= 64) skipped
    assert step.outputs.num_batched_tokens == 40
    assert ids(s.waiting) == ["b", "c"]
    c = s.starvation
    assert (c.head_of_line_events, c.head_of_line_bypassable, c.head_of_line_budget) == (1, 1, 1)


def test_rule2_a_blocked_head_with_nothing_admissible_behind_is_not_a_head_of_line_event():
    s = make_scheduler(100, max_model_len=64, max_num_batched_tokens=64)
    for rid, n in (("a", 40), ("b", 40), ("c", 30)):
        s.add_seq_group(make_seq_group(rid, n))
    engine_step(s)
    assert ids(s.waiting) == ["b", "c"]  # c: 40 + 30 > 64 would not fit either
    assert s.starvation.head_of_line_events == 0


# Rule 3 -----------------------------------------------------------------------
def test_rule3_over_long_prompt_is_ignored_and_does_not_block(caplog):
    s = make_scheduler(40, max_model_len=64)  # budget max(64, 2048) -> prompt_limit 64
    assert s._get_prompt_limit() == 64
    for rid, n in (("big", 65), ("ok", 64), ("tiny", 1)):
        s.add_seq_group(make_seq_group(rid, n))
    with caplog.at_level(logging.WARNING, logger="vllm.v0"):
        step = engine_step(s)
    assert step.ignored == ["big"]
    assert step.prefills == [("ok", 64), ("tiny", 1)]
    assert step.outputs.ignored_seq_groups[0].seq.status == SequenceStatus.FINISHED_IGNORED
    assert [r.getMessage() for r in caplog.records] == ["Input prompt (65 tokens) is too long and exceeds limit of 64"]
    assert s.num_ignored_seq_groups == 1
    assert "big" not in ids(s.waiting) + ids(s.running)


def test_rule3_prompt_limit_without_chunking_is_min_of_model_len_and_budget():
    s = make_scheduler(40, max_model_len=64, max_num_batched_tokens=100)
    assert s._get_prompt_limit() == 64
    # vLLM's config check makes the budget >= max_model_len without chunking.
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(32\) is smaller than max_model_len \(64\)"):
        SchedulerConfig(max_num_batched_tokens=32, max_model_len=64, max_num_seqs=8)


def test_rule3_prompt_limit_with_chunking_is_max_model_len():
    s = make_scheduler(40, max_model_len=64, max_num_batched_tokens=128, chunked=True)
    assert s._get_prompt_limit() == 64
    s.add_seq_group(make_seq_group("big", 65))
    assert engine_step(s).ignored == ["big"]


def test_rule3_with_chunking_the_limit_sees_the_chunk_not_the_prompt():
    # vLLM compares the CHUNKED token count with the limit: a 65-token prompt cut
    # to a 16-token chunk passes a limit of 64.
    s = make_scheduler(40, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=8, chunked=True)
    s.add_seq_group(make_seq_group("big", 65))
    step = engine_step(s)
    assert step.ignored == []
    assert step.prefills == [("big", 16)]


# Rule 4 -----------------------------------------------------------------------
def test_rule4_victim_is_the_latest_arrival_not_the_latest_admitted():
    s = make_scheduler(4, block_size=4)
    # Admitted in the order c, a, b; arrivals say a < b < c.
    for rid, arrival in (("c", 3.0), ("a", 1.0), ("b", 2.0)):
        s.add_seq_group(make_seq_group(rid, 4, max_tokens=20, arrival_time=arrival, block_size=4))
    engine_step(s)
    assert ids(s.running) == ["c", "a", "b"]
    assert s.block_manager.get_num_free_gpu_blocks() == 1
    step = engine_step(s, now=10)
    # a appends (takes the last block); b cannot -> the tail of the arrival-sorted queue, c.
    assert step.preempted == ["c"]
    assert step.decodes == ["a", "b"]
    assert ids(s.running) == ["a", "b"]
    assert ids(s.waiting) == ["c"]


# Rule 5 -----------------------------------------------------------------------
def test_rule5_recomputed_victims_return_to_the_head_of_waiting_in_arrival_order():
    s = make_scheduler(5, block_size=4)
    for k, rid in enumerate("abcde"):
        s.add_seq_group(make_seq_group(rid, 4, max_tokens=20, arrival_time=1.0 + k, block_size=4))
    engine_step(s)
    assert s.block_manager.get_num_free_gpu_blocks() == 0
    # w arrived before all of them but could not be admitted (it needs 3 blocks).
    s.add_seq_group(make_seq_group("w", 12, arrival_time=0.5, block_size=4))
    step = engine_step(s, now=10)
    assert step.prefills == []
    # a: victim e; b: victim d; c: alone, preempts itself.
    assert step.preempted == ["e", "d", "c"]
    assert step.decodes == ["a", "b"]
    assert ids(s.waiting) == ["c", "d", "e", "w"]
    for rid in "cde":
        g = next(g for g in s.waiting if g.request_id == rid)
        assert g.seq.status == SequenceStatus.WAITING and g.seq.get_num_computed_tokens() == 0
    c = s.starvation
    assert (c.recompute_reinsertions, c.recompute_overtaken, c.recompute_overtaken_earlier_arrivals) == (3, 3, 3)


def test_rule5_a_recomputed_victim_prefills_its_outputs_too():
    # 2 blocks of 4; the prompt (5 tokens) fills both. v1's block manager wants one
    # FREE block per running sequence to decode, even though block 2 has room:
    # the lone request preempts itself, then comes back with prompt + outputs.
    s = make_scheduler(2, block_size=4)
    s.add_seq_group(make_seq_group("a", 5, max_tokens=20, block_size=4))
    assert engine_step(s).prefills == [("a", 5)]
    step = engine_step(s, now=1)
    assert step.preempted == ["a"] and step.decodes == []
    assert ids(s.waiting) == ["a"]
    assert engine_step(s, now=2).prefills == [("a", 6)]


# Rule 6 -----------------------------------------------------------------------
def test_rule6_no_prefill_while_swapped_is_non_empty():
    s = make_scheduler(4, block_size=4, num_cpu_blocks=8, preemption_mode="swap")
    s.add_seq_group(make_seq_group("a", 8, max_tokens=30, arrival_time=0, block_size=4))
    s.add_seq_group(make_seq_group("b", 8, max_tokens=30, arrival_time=1, block_size=4))
    engine_step(s)
    step = engine_step(s, now=1)
    assert step.preempted == ["b"] and ids(s.swapped) == ["b"]
    assert s.block_manager.get_num_free_gpu_blocks() == 1
    s.add_seq_group(make_seq_group("short", 2, arrival_time=2, block_size=4))  # 1 block: it would fit
    step = engine_step(s, now=2)
    assert step.prefills == []
    assert step.decodes == ["a"]
    assert ids(s.waiting) == ["short"]
    c = s.starvation
    assert (c.swap_priority_events, c.swap_priority_waiting, c.swap_priority_bypassable) == (1, 1, 1)


def test_rule6_chunked_prefill_admits_prefills_while_swapped_is_non_empty():
    s = make_scheduler(
        4,
        block_size=4,
        num_cpu_blocks=8,
        preemption_mode="swap",
        chunked=True,
        max_num_batched_tokens=64,
        max_model_len=64,
    )
    s.add_seq_group(make_seq_group("a", 8, max_tokens=30, arrival_time=0, block_size=4))
    s.add_seq_group(make_seq_group("b", 8, max_tokens=30, arrival_time=1, block_size=4))
    engine_step(s)
    engine_step(s, now=1)
    assert ids(s.swapped) == ["b"]
    s.add_seq_group(make_seq_group("short", 2, arrival_time=2, block_size=4))
    step = engine_step(s, now=2)
    assert step.prefills == [("short", 2)]
    assert step.decodes == ["a"]
    assert s.starvation.swap_priority_events == 0
