"""Hand-written v1 conformance scenarios, each with the facts vLLM 0.33.0 is known
to show on it (docs/reference.md: v1 §4, v1 §7 and "Cascade fix PR").

The facts are checked on the oracle's trace (proof that the driver reproduces
vLLM's own tests) and on ours; the differential comparison then checks every
other step of the trace. Scenario format: v1_scenario.py. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable

Expectation = Callable[[dict], list[str]]


def config(**overrides) -> dict:
    base = {
        "num_blocks": 100,
        "block_size": 16,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 8192,
        "max_model_len": 2048,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "policy": "fcfs",
        "async_scheduling": True,
        "force_defer_block_free": True,
        "prefix_guard": False,
    }
    if "enable_prefix_caching" in overrides:  # optional key: only caching scenarios carry it
        base["enable_prefix_caching"] = False
    unknown = set(overrides) - set(base)
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}; allowed: {sorted(base)}")
    base.update(overrides)
    return base


def req(rid: str, prompt_len: int, max_tokens: int, arrival: float, priority: int = 0, stop=(42,)) -> dict:
    return {
        "id": rid,
        "prompt_len": prompt_len,
        "max_tokens": max_tokens,
        "priority": priority,
        "arrival_time": float(arrival),
        "stop_token_ids": list(stop),
        "ignore_eos": False,
    }


S, U = {"op": "schedule"}, {"op": "update"}


def _schedules(trace: dict) -> list[dict]:
    return [r for r in trace["records"] if r["op"] == "schedule"]


def _check(problems: list[str], cond: bool, text: str) -> None:
    if not cond:
        problems.append(text)


# -- test_allocation_retry_waits_for_fence_then_succeeds ----------------------------


def allocation_retry(policy: str, prefix_guard: bool) -> tuple[dict, Expectation]:
    """3 x 33-token prompts, two schedules in flight, priorities set afterwards
    (worst=9, trigger=0, tail=1), one injected allocation failure before and after
    the fence advances. vLLM: calls 1/2 (FCFS/PRIORITY) with the fix, 3/4 without."""
    failed_call = 1 if policy == "fcfs" else 2
    names = ["worst", "trigger", "tail"]
    scenario = {
        "id": f"hand-allocation-retry-{policy}-{'prefix' if prefix_guard else 'fixed'}",
        "seed": 1,
        "note": "vLLM test_allocation_retry_waits_for_fence_then_succeeds",
        "config": config(policy=policy, prefix_guard=prefix_guard),
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [req(n, 33, 10, i) for i, n in enumerate(names)],
        "actions": [
            {"op": "add", "ids": names},
            S,
            S,
            {"op": "set_priority", "priorities": {"worst": 9, "trigger": 0, "tail": 1}},
            {"op": "fail_next_allocation", "call_number": failed_call},
            S,  # phase 1: fence not advanced
            U,
            U,
            U,
            {"op": "fail_next_allocation", "call_number": failed_call},
            S,  # phase 2: fence advanced
            {"op": "drain", "depth": 2, "max_steps": 100},
        ],
    }
    trigger = names[failed_call - 1]
    victim = "worst" if policy == "priority" else "tail"

    def expect(trace: dict) -> list[str]:
        problems: list[str] = []
        sch = _schedules(trace)
        if len(sch) < 4:
            return [f"expected >= 4 schedule records, got {len(sch)}"]
        blocked, resumed = sch[2], sch[3]
        if prefix_guard:
            want = 3 if policy == "fcfs" else 4
            _check(problems, blocked["alloc_calls"] == want, f"phase 1 alloc_calls {blocked['alloc_calls']} != {want}")
            _check(
                problems, blocked["preempted"] == [victim], f"phase 1 preempted {blocked['preempted']} != [{victim}]"
            )
        else:
            _check(
                problems,
                blocked["alloc_calls"] == failed_call,
                f"phase 1 alloc_calls {blocked['alloc_calls']} != {failed_call}",
            )
            _check(problems, blocked["preempted"] == [], f"phase 1 preempted {blocked['preempted']} != []")
            _check(problems, trigger not in blocked["scheduled"], f"phase 1 scheduled the trigger {trigger}")
            _check(problems, resumed["alloc_calls"] > failed_call, "phase 2 made no retry")
            _check(problems, victim in resumed["preempted"], f"phase 2 did not preempt {victim}")
            _check(problems, trigger in resumed["scheduled"], f"phase 2 did not schedule the trigger {trigger}")
            if policy == "priority":
                _check(problems, "tail" in resumed["scheduled"], "phase 2 skipped tail (cursor)")
        return problems

    return scenario, expect


# -- test_kv_pressure_preempt_mid_handoff (consumer / no-connector variants) -------------


def mid_handoff(fence: bool, prefix_guard: bool = False) -> tuple[dict, Expectation]:
    """5 blocks of 16 (4 usable), two 32-token prompts fill the pool; the second
    schedule needs a block for `decode` and the victim is the tail `handoff`
    (max_tokens=1, its only token in flight). No fence: `handoff` is preempted
    and finishes from its delivered stale token. Fence: the retry stops, nothing is
    preempted and `handoff` finishes from its own output."""
    tag = "prefix" if prefix_guard else ("fence" if fence else "nofence")
    scenario = {
        "id": f"hand-mid-handoff-{tag}",
        "seed": 2,
        "note": "vLLM test_kv_pressure_preempt_mid_handoff (consumer rows; no connector here)",
        "config": config(num_blocks=5, force_defer_block_free=fence, prefix_guard=prefix_guard),
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [req("decode", 32, 4, 0), req("handoff", 32, 1, 1)],
        "actions": [{"op": "add", "ids": ["decode", "handoff"]}, S, S, {"op": "drain", "depth": 2, "max_steps": 60}],
    }

    def expect(trace: dict) -> list[str]:
        problems: list[str] = []
        sch = _schedules(trace)
        second = sch[1] if len(sch) > 1 else {"preempted": None}
        handoff = trace["final"].get("handoff", {})
        if fence and not prefix_guard:
            _check(problems, second["preempted"] == [], f"fenced: 2nd schedule preempted {second['preempted']}")
            _check(problems, handoff.get("num_preemptions") == 0, "fenced: handoff was preempted")
        else:
            _check(problems, "handoff" in (second["preempted"] or []), "2nd schedule did not preempt handoff")
        _check(problems, handoff.get("status") == "FINISHED_LENGTH_CAPPED", f"handoff ended {handoff.get('status')}")
        _check(problems, len(handoff.get("output_token_ids", [])) == 1, "handoff did not finish with 1 token")
        return problems

    return scenario, expect


# -- PRIORITY cursor (#49206): a victim below the cursor that was skipped this step ---


def priority_cursor() -> tuple[dict, Expectation]:
    """Async, fence off. `A` (max_tokens=2) has its last token in flight, so the
    async guard skips it; `B`'s allocation fails; the victim is `A` (priority 9)
    at index 0 < cursor, unscheduled. vLLM decrements the cursor anyway, so `C`
    is still scheduled (the pre-#49206 code skipped it)."""
    scenario = {
        "id": "hand-priority-cursor-skipped-victim",
        "seed": 3,
        "note": "cursor case of reference §4 without throttle_prefills: the async guard skips the victim",
        "config": config(policy="priority", force_defer_block_free=False),
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [req("A", 20, 2, 0), req("B", 20, 10, 1), req("C", 20, 10, 2)],
        "actions": [
            {"op": "add", "ids": ["A", "B", "C"]},
            S,
            S,
            U,
            {"op": "set_priority", "priorities": {"A": 9, "B": 0, "C": 1}},
            {"op": "fail_next_allocation", "call_number": 1},
            S,
            {"op": "drain", "depth": 2, "max_steps": 60},
        ],
    }

    def expect(trace: dict) -> list[str]:
        problems: list[str] = []
        third = _schedules(trace)[2]
        _check(problems, third["preempted"] == ["A"], f"3rd schedule preempted {third['preempted']} != ['A']")
        _check(problems, set(third["scheduled"]) == {"B", "C"}, f"3rd schedule ran {sorted(third['scheduled'])}")
        return problems

    return scenario, expect


def priority_self_preemption() -> tuple[dict, Expectation]:
    """PRIORITY, fence off: running [r0, r1 (priority 9), r2], r1's allocation
    fails, r1 is the least urgent so it preempts itself and the pass CONTINUES:
    r2 is still scheduled (docs/reference.md, v1 §7.17)."""
    scenario = {
        "id": "hand-priority-self-preemption-continues",
        "seed": 4,
        "note": "reference v1-fence-and-cascade.md §7 item 17",
        "config": config(policy="priority", async_scheduling=False, force_defer_block_free=False),
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [req("r0", 20, 6, 0), req("r1", 20, 6, 1), req("r2", 20, 6, 2)],
        "actions": [
            {"op": "add", "ids": ["r0", "r1", "r2"]},
            S,
            U,
            {"op": "set_priority", "priorities": {"r1": 9}},
            {"op": "fail_next_allocation", "call_number": 2},
            S,
            {"op": "drain", "depth": 1, "max_steps": 60},
        ],
    }

    def expect(trace: dict) -> list[str]:
        problems: list[str] = []
        second = _schedules(trace)[1]
        _check(problems, second["preempted"] == ["r1"], f"preempted {second['preempted']} != ['r1']")
        _check(problems, set(second["scheduled"]) == {"r0", "r2"}, f"scheduled {sorted(second['scheduled'])}")
        return problems

    return scenario, expect


def fence_across_three_steps() -> tuple[dict, Expectation]:
    """Three steps scheduled, none processed, then an abort: its blocks carry
    fence 3 and return to the pool only when output 3 is processed (docs/reference.md, v1 §7.5)."""
    scenario = {
        "id": "hand-abort-fence-held-across-three-steps",
        "seed": 5,
        "note": "vLLM test_fence_held_across_multiple_inflight_steps",
        "config": config(num_blocks=20),
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [req("a", 40, 20, 0), req("b", 40, 20, 1)],
        "actions": [
            {"op": "add", "ids": ["a", "b"]},
            S,
            S,
            S,
            {"op": "abort", "ids": ["a"]},
            U,
            U,
            U,
            {"op": "drain", "depth": 2, "max_steps": 60},
        ],
    }

    def expect(trace: dict) -> list[str]:
        problems: list[str] = []
        recs = trace["records"]
        abort = next((i for i, r in enumerate(recs) if r["op"] == "abort"), None)
        if abort is None or len(recs) < abort + 4:
            return ["abort or the three updates missing"]
        a, u1, u2, u3 = recs[abort : abort + 4]
        _check(problems, a["deferred_frees"] == 1, f"abort deferred_frees {a['deferred_frees']} != 1")
        _check(problems, u1["free_blocks"] == a["free_blocks"] == u2["free_blocks"], "blocks returned before fence 3")
        _check(problems, u3["free_blocks"] > u2["free_blocks"] and u3["deferred_frees"] == 0, "fence 3 did not free")
        return problems

    return scenario, expect


def steady_state_tight_pool(prefix_guard: bool = False) -> tuple[dict, Expectation]:
    """Depth-2 queue, 6 usable blocks, three 31-token prompts (docs/reference.md,
    v1 §4, 'Steady state with the fix'): with the fix the first step that needs a new
    block preempts nothing, the next one preempts the tail."""
    scenario = {
        "id": f"hand-steady-state-tight-pool-{'prefix' if prefix_guard else 'fixed'}",
        "seed": 6,
        "note": "reference v1-fence-and-cascade.md §4, depth-2, 6 usable blocks",
        "config": config(num_blocks=7, prefix_guard=prefix_guard),
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [req(f"r{i}", 31, 12, i) for i in range(3)],
        "actions": [{"op": "add", "ids": ["r0", "r1", "r2"]}, {"op": "drain", "depth": 2, "max_steps": 200}],
    }

    def expect(trace: dict) -> list[str]:
        problems: list[str] = []
        sch = _schedules(trace)
        first = next((i for i, r in enumerate(sch) if r["preempted"]), None)
        if first is None:
            return ["no preemption at all"]
        if not prefix_guard:
            _check(problems, first > 0 and sch[first - 1]["scheduled"] == {}, "the fenced step before was not empty")
            _check(problems, sch[first]["preempted"] == ["r2"], f"first preemption {sch[first]['preempted']}")
        for rid, fin in trace["final"].items():
            _check(problems, fin["status"].startswith("FINISHED"), f"{rid} ended {fin['status']}")
        return problems

    return scenario, expect


def prompt(tag: int, length: int) -> list[int]:
    """Prompt content for caching scenarios: `tag` picks the content."""
    return [(tag * 37 + i) % 997 for i in range(length)]


def with_prompt(request: dict, tokens: list[int]) -> dict:
    return dict(request, prompt_len=len(tokens), prompt_token_ids=tokens)


def _admitted_hit(trace: dict, rid: str) -> int | None:
    """Tokens `rid` had computed when first admitted (its prefix-cache hit)."""
    for r in _schedules(trace):
        if rid in r["scheduled"]:
            return r["computed"][rid] - r["scheduled"][rid]
    return None


def cache_eviction_order() -> tuple[dict, Expectation]:
    """Freed cached blocks go to the free queue's tail, the request's tail
    block first; allocation takes never-used blocks first, then evicts from
    the head. `b` needs six of the eight blocks: the five unused ones and
    `a`'s *last* cached block, so a repeat of `a`'s prompt still hits its
    first two blocks."""
    first = prompt(1, 48)
    scenario = {
        "id": "hand-cache-eviction-order",
        "seed": 11,
        "note": "prefix caching: free-queue order and eviction",
        "config": config(
            num_blocks=9, enable_prefix_caching=True, async_scheduling=False, force_defer_block_free=False
        ),
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [
            with_prompt(req("a", 48, 1, 0), first),
            with_prompt(req("b", 96, 1, 1), prompt(2, 96)),
            with_prompt(req("c", 48, 1, 2), first),
        ],
        "actions": [
            {"op": "add", "ids": ["a"]},
            {"op": "drain", "depth": 1, "max_steps": 10},
            {"op": "add", "ids": ["b"]},
            {"op": "drain", "depth": 1, "max_steps": 10},
            {"op": "add", "ids": ["c"]},
            {"op": "drain", "depth": 1, "max_steps": 10},
        ],
    }

    def expect(trace: dict) -> list[str]:
        problems: list[str] = []
        _check(problems, _admitted_hit(trace, "b") == 0, f"b hit {_admitted_hit(trace, 'b')} tokens, expected 0")
        _check(problems, _admitted_hit(trace, "c") == 32, f"c hit {_admitted_hit(trace, 'c')} tokens, expected 32")
        return problems

    return scenario, expect


def cache_hit_on_fenced_blocks() -> tuple[dict, Expectation]:
    """A request finishes while a step that included it is in flight: its
    blocks wait in `deferred_frees` (still referenced, not free) yet stay in
    the prefix cache, so a request with the same prompt admitted meanwhile
    hits them."""
    shared = prompt(3, 40)
    scenario = {
        "id": "hand-cache-hit-on-fenced-blocks",
        "seed": 12,
        "note": "prefix caching: a hit on blocks freed under the fence",
        "config": config(num_blocks=20, enable_prefix_caching=True),
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [with_prompt(req("a", 40, 2, 0), shared), with_prompt(req("b", 40, 4, 1), shared)],
        "actions": [
            {"op": "add", "ids": ["a"]},
            S,
            S,
            U,
            S,
            U,
            {"op": "add", "ids": ["b"]},
            S,
            U,
            {"op": "drain", "depth": 2, "max_steps": 40},
        ],
    }

    def expect(trace: dict) -> list[str]:
        problems: list[str] = []
        _check(problems, _admitted_hit(trace, "b") == 32, f"b hit {_admitted_hit(trace, 'b')} tokens, expected 32")
        return problems

    return scenario, expect


def cache_readmission_after_preemption() -> tuple[dict, Expectation]:
    """Two growing requests in a tight pool: the victim of a preemption
    comes back and finds its own blocks still cached."""
    scenario = {
        "id": "hand-cache-readmission-after-preemption",
        "seed": 13,
        "note": "prefix caching: re-admission after preemption",
        "config": config(
            num_blocks=8, enable_prefix_caching=True, async_scheduling=False, force_defer_block_free=False
        ),
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [with_prompt(req("a", 40, 40, 0), prompt(4, 40)), with_prompt(req("b", 40, 40, 1), prompt(5, 40))],
        "actions": [{"op": "add", "ids": ["a", "b"]}, {"op": "drain", "depth": 1, "max_steps": 200}],
    }

    def expect(trace: dict) -> list[str]:
        problems: list[str] = []
        sch = _schedules(trace)
        victims = {rid for r in sch for rid in r["preempted"]}
        _check(problems, bool(victims), "no preemption")
        readmitted_hits = []
        running_before: set[str] = set()
        for r in sch:
            for rid, n in r["scheduled"].items():
                if rid in victims and rid not in running_before and r["computed"][rid] - n > 0:
                    readmitted_hits.append(rid)
            running_before = set(r["running"])
        _check(problems, bool(readmitted_hits), "no preempted request came back with a hit")
        return problems

    return scenario, expect


def all_handwritten() -> list[tuple[dict, Expectation]]:
    cases = []
    for policy in ("fcfs", "priority"):
        for prefix in (False, True):
            cases.append(allocation_retry(policy, prefix))
    cases += [mid_handoff(False), mid_handoff(True), mid_handoff(True, prefix_guard=True)]
    cases += [priority_cursor(), priority_self_preemption(), fence_across_three_steps()]
    cases += [steady_state_tight_pool(False), steady_state_tight_pool(True)]
    cases += [cache_eviction_order(), cache_hit_on_fenced_blocks(), cache_readmission_after_preemption()]
    return cases
