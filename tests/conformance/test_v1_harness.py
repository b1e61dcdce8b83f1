"""The v1 differential harness without the oracle: scenario validation, the
generator, the fake sampler, the comparison and shrinker, and our engine replayed
against vLLM 0.33.0's recorded traces (golden/v1_traces.json.gz)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import v1_harness  # noqa: E402
from v1_compare import compare, shrink  # noqa: E402
from v1_generate import generate, generate_suite, with_prefix_guard  # noqa: E402
from v1_handwritten import all_handwritten  # noqa: E402
from v1_ours import run_ours  # noqa: E402
from v1_scenario import EOS_TOKEN_ID, ScenarioError, fake_token, validate  # noqa: E402

# -- scenario format ---------------------------------------------------------------


def _scenario():
    return copy.deepcopy(all_handwritten()[0][0])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s["config"].pop("num_blocks"), "config.num_blocks is missing"),
        (lambda s: s["config"].update(policy="lifo"), "config.policy must be one of ('fcfs', 'priority')"),
        (lambda s: s["config"].update(block_size=True), "config.block_size must be int"),
        (lambda s: s["config"].update(colour=1), "unknown config keys ['colour']"),
        (lambda s: s["requests"][0].update(prompt_len=5000), "prompt_len 5000 must be < config.max_model_len"),
        (lambda s: s["requests"].append(dict(s["requests"][0])), "id 'worst' is duplicated"),
        (lambda s: s["actions"].append({"op": "add", "ids": ["nobody"]}), "unknown: ['nobody']"),
        (lambda s: s["actions"].append({"op": "jump"}), "op must be one of"),
        (lambda s: s["actions"].append({"op": "fail_next_allocation", "call_number": 0}), "call_number must be"),
        (lambda s: s["actions"].append({"op": "drain", "depth": 9, "max_steps": 5}), "depth in 1..4"),
        (lambda s: s.update(sampler={"stop_prob": 1.5}), "sampler.stop_prob must be a probability"),
    ],
)
def test_validate_names_the_bad_field(mutate, message):
    scenario = _scenario()
    mutate(scenario)
    with pytest.raises(ScenarioError) as err:
        validate(scenario)
    assert message in str(err.value)


def test_fake_sampler_is_deterministic_and_honours_probabilities():
    s = {"seed": 7, "sampler": {"stop_prob": 0.0, "eos_prob": 0.0}}
    tokens = [fake_token(s, step, "r", [5]) for step in range(200)]
    assert tokens == [fake_token(s, step, "r", [5]) for step in range(200)]
    assert 5 not in tokens and EOS_TOKEN_ID not in tokens
    assert len(set(tokens)) > 150  # not a constant
    always_stop = {"seed": 7, "sampler": {"stop_prob": 1.0}}
    assert {fake_token(always_stop, step, "r", [5, 6]) for step in range(50)} == {5, 6}
    always_eos = {"seed": 7, "sampler": {"stop_prob": 0.0, "eos_prob": 1.0}}
    assert fake_token(always_eos, 0, "r", [5]) == EOS_TOKEN_ID
    # No stop tokens: the stop share does not turn into EOS.
    no_stops = {"seed": 7, "sampler": {"stop_prob": 0.9, "eos_prob": 0.0}}
    assert EOS_TOKEN_ID not in {fake_token(no_stops, step, "r", []) for step in range(50)}


# -- generator -------------------------------------------------------------------------


def test_generator_is_reproducible_per_seed_and_valid():
    assert generate(42) == generate(42)
    assert generate(42) != generate(43)
    suite = generate_suite(50)
    fixed = [s for s in suite if not s["config"]["prefix_guard"]]
    twins = [s for s in suite if s["config"]["prefix_guard"]]
    assert len(fixed) == 50
    assert [t["id"] for t in twins] == [s["id"] + "-prefix" for s in fixed if s["config"]["force_defer_block_free"]]
    for s in suite:
        validate(s)
    configs = [s["config"] for s in fixed]
    # Both policies, fence on and off, async on and off, chunked on and off, thresholds.
    for key in ("force_defer_block_free", "async_scheduling", "enable_chunked_prefill"):
        assert {c[key] for c in configs} == {True, False}, key
    assert {c["policy"] for c in configs} == {"fcfs", "priority"}
    assert any(c["long_prefill_token_threshold"] > 0 for c in configs)
    assert {s["actions"][-1]["depth"] for s in fixed} == {1, 2}


def test_generated_actions_follow_the_batch_queue_depth():
    for seed in range(30):
        s = generate(seed)
        depth = s["actions"][-1]["depth"]
        pending = 0
        for act in s["actions"][:-1]:
            if act["op"] == "schedule":
                pending += 1
                assert pending <= depth
            elif act["op"] == "update":
                assert pending > 0
                pending -= 1


# -- comparison and shrinking --------------------------------------------------------------


def _trace(records, final=None, error=None):
    return {"id": "x", "records": records, "final": final or {}, "error": error}


def test_compare_reports_first_differing_record_and_keys():
    rec = {"op": "schedule", "step": 0, "scheduled": {"a": 4}, "free_blocks": 3, "action_index": 1}
    assert compare(_trace([rec]), _trace([dict(rec)])) is None
    m = compare(_trace([rec, rec]), _trace([rec, dict(rec, free_blocks=2)]))
    assert m is not None and m.where == "record 1 (schedule step 0, action 1)" and m.keys == ["free_blocks"]
    assert "free_blocks: vllm=3" in m.describe()
    assert compare(_trace([rec]), _trace([])).keys == ["<missing record>"]
    err = {"action_index": 2, "type": "AssertionError", "message": "boom", "traceback": ""}
    assert compare(_trace([rec]), _trace([rec], error=err)).where == "error"
    assert compare(_trace([], {"a": {"status": "RUNNING"}}), _trace([], {"a": {"status": "WAITING"}})).keys == ["a"]


def test_shrinker_keeps_only_what_the_mismatch_needs():
    scenario = generate(137)
    culprit = scenario["requests"][1]["id"]

    def still_fails(candidate):
        # A fake defect: "mismatch" whenever the culprit is added before the 3rd schedule.
        schedules = 0
        for act in candidate["actions"]:
            if act["op"] == "schedule":
                schedules += 1
            if act["op"] == "add" and culprit in act["ids"] and schedules < 3:
                return compare(_trace([{"op": "add", "action_index": 0}]), _trace([{"op": "add", "action_index": 1}]))
        return None

    sig = still_fails(scenario).signature
    small, spent = shrink(scenario, still_fails, sig)
    assert [r["id"] for r in small["requests"]] == [culprit]
    assert small["actions"] == [{"op": "add", "ids": [culprit]}]
    assert spent < 400


# -- our engine against vLLM's recorded traces ------------------------------------------------


def test_handwritten_facts_hold_on_our_engine():
    cases = all_handwritten()
    traces = run_ours([s for s, _ in cases])
    problems = [f"{s['id']}: {p}" for (s, expect), t in zip(cases, traces) for p in expect(t)]
    assert problems == []
    assert all(t["error"] is None for t in traces)


def test_our_engine_matches_vllm_recorded_traces():
    golden = v1_harness.load_golden()
    cases = golden["cases"]
    assert [c["scenario"] for c in cases] == v1_harness.golden_scenarios(), (
        "golden scenarios changed: re-record with python tests/conformance/run_v1.py --record-golden"
    )
    ours = run_ours([c["scenario"] for c in cases])
    failures = [m.describe() for c, t in zip(cases, ours) if (m := compare(c["trace"], t)) is not None]
    assert not failures, "\n\n".join(failures)


def test_golden_traces_discriminate_the_preemption_guard():
    """The recorded vLLM traces must be able to fail: replaying a fence-on golden
    scenario with the other guard gives a different trace."""
    golden = v1_harness.load_golden()
    case = next(c for c in golden["cases"] if c["scenario"]["id"] == "rand-0127")
    flipped = with_prefix_guard(case["scenario"])
    flipped["id"] = "rand-0127"
    mismatch = compare(case["trace"], run_ours([flipped])[0])
    assert mismatch is not None and "preempted" in mismatch.keys
