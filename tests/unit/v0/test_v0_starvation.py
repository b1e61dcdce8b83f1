"""The three starvation paths of the v0 FCFS scheduler, each provoked by a
minimal scenario and named by `diagnose` from the counters alone; plus the
reference's control experiments (remove the long prompt; enable chunking)."""

import pytest

from engine.outputs import ModelRunnerOutput
from engine.request import Request, SamplingParams
from engine.v0 import CacheConfig, SchedulerConfig, StarvationCounters, V0SchedulerAdapter, diagnose


def make_adapter(num_gpu_blocks, block_size=4, num_cpu_blocks=0, **sched):
    cfg = {"max_num_seqs": 8, "max_model_len": 256, **sched}
    return V0SchedulerAdapter(
        SchedulerConfig(**cfg),
        CacheConfig(num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks, block_size=block_size),
        log_startup=False,
    )


def drive(adapter, arrivals, max_steps=500):
    """arrivals: {step: [(request_id, prompt_len, max_tokens), ...]}; runs to completion."""
    for step in range(max_steps):
        for k, (rid, prompt_len, max_tokens) in enumerate(arrivals.get(step, [])):
            adapter.add_request(
                Request(
                    rid,
                    list(range(prompt_len)),
                    SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    arrival_time=step + 0.001 * (k + 1),
                )
            )
        if not adapter.has_requests() and step > max(arrivals):
            return step
        so = adapter.schedule(now=float(step))
        rids = list(so.num_scheduled_tokens)
        sampled = [[] if adapter.requests[r].is_prefill_chunk else [7] for r in rids]
        adapter.update_from_output(so, ModelRunnerOutput(rids, {r: i for i, r in enumerate(rids)}, sampled))
    raise AssertionError("scenario did not finish")


HOL_ARRIVALS = {0: [("big", 100, 8)], 1: [("long", 100, 4), ("short", 8, 4)]}


def test_head_of_line_blocking_is_detected_and_dominant():
    # 10 blocks of 16: big holds 7; long (7 blocks) waits at the head while short (1 block) would fit.
    a = make_adapter(10, block_size=16)
    drive(a, HOL_ARRIVALS)
    c = a.counters()["starvation"]
    # Steps 1..7: big decodes (7 tokens after its prefill) while long blocks short.
    assert (c["head_of_line_events"], c["head_of_line_bypassable"], c["head_of_line_alloc_later"]) == (7, 7, 7)
    assert c["head_of_line_blockers"] == {"long": 7}
    assert c["recompute_reinsertions"] == 0 and c["swap_priority_events"] == 0
    path, why = a.diagnose()
    assert path == "head-of-line"
    assert why.startswith(
        "head-of-line dominates with 7 of 7 held-back request-steps (100.0%). "
        "The worst blocking head was request 'long' (7 steps)."
    )


def test_control_without_the_long_prompt_nothing_starves():
    a = make_adapter(10, block_size=16)
    drive(a, {0: [("big", 100, 8)], 1: [("short", 8, 4)]})
    assert a.diagnose()[0] == "none"


def test_token_budget_head_of_line_goes_away_with_chunked_prefill():
    arrivals = {0: [("a", 40, 20), ("long", 60, 2), ("s0", 8, 2), ("s1", 8, 2)]}
    plain = make_adapter(100, max_model_len=64, max_num_batched_tokens=64)
    drive(plain, arrivals)
    c = plain.counters()["starvation"]
    # a (40) is admitted, long (60) overflows the 64-token budget, s0 + s1 (16) would have fit.
    assert (c["head_of_line_events"], c["head_of_line_bypassable"], c["head_of_line_budget"]) == (1, 2, 1)
    assert plain.diagnose()[0] == "head-of-line"
    chunked = make_adapter(100, max_model_len=64, max_num_batched_tokens=64, enable_chunked_prefill=True)
    drive(chunked, arrivals)
    assert chunked.counters()["starvation"]["head_of_line_events"] == 0


def test_recompute_reinsertion_is_detected_and_dominant():
    # 6 blocks of 4. q0 and q1 (2 blocks each) grow while late (4 blocks) waits:
    # q1, the latest running arrival, is preempted and put back ahead of late, again and again.
    a = make_adapter(6)
    drive(a, {0: [("q0", 8, 10), ("q1", 8, 10)], 1: [("late", 16, 4)]})
    c = a.counters()["starvation"]
    assert (c["recompute_reinsertions"], c["recompute_overtaken"], c["recompute_overtaken_earlier_arrivals"]) == (
        4,
        4,
        0,
    )
    assert c["head_of_line_events"] == 0 and c["swap_priority_events"] == 0
    assert a.counters()["num_preemptions_recompute"] == 4
    assert a.diagnose()[0] == "preempt-reinsert"


def test_swap_priority_is_detected_and_dominant():
    # 4 blocks of 4 with swap space: b is swapped out; short (1 block) would fit
    # but no prefill runs while b sits in `swapped`.
    a = make_adapter(4, num_cpu_blocks=8, preemption_mode="swap")
    drive(a, {0: [("a", 8, 6), ("b", 8, 6)], 2: [("short", 2, 2)]})
    c = a.counters()["starvation"]
    assert (c["swap_priority_events"], c["swap_priority_waiting"], c["swap_priority_bypassable"]) == (5, 5, 5)
    assert c["head_of_line_events"] == 0 and c["recompute_reinsertions"] == 0
    assert a.counters()["num_preemptions_swap"] >= 1
    assert a.diagnose()[0] == "swap-priority"


def test_diagnose_reads_plain_counters_and_breaks_ties_in_a_fixed_order():
    assert diagnose(StarvationCounters())[0] == "none"
    assert diagnose({"recompute_overtaken": 3, "swap_priority_bypassable": 4})[0] == "swap-priority"
    tie = StarvationCounters(head_of_line_bypassable=2, recompute_overtaken=2, swap_priority_bypassable=2)
    path, why = diagnose(tie)
    assert path == "head-of-line" and "2 of 6 held-back request-steps (33.3%)" in why
    with pytest.raises(TypeError):
        diagnose({"not_a_counter": 1})
