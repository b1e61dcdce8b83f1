"""Differential conformance of engine/v0 against vLLM 0.5.3.post1's real v0
scheduler: >= 200 random scenarios (tight pools, swap space on and off, chunked
prefill on and off, over-long prompts, arrivals over steps) plus hand-written
ones, compared step by step. Skipped with the reason when the oracle is absent."""

import pytest
from v0_harness import ORACLE_TIMEOUT_S, compare, oracle_missing_reason, run_all, run_ours
from v0_scenarios import hand_written_scenarios, random_scenarios

# One oracle call replays every scenario: past pytest's default 300 s on a
# loaded machine, so the test waits as long as that call may take.
pytestmark = [pytest.mark.oracle, pytest.mark.timeout(ORACLE_TIMEOUT_S + 60)]

NUM_RANDOM_SCENARIOS = 240


@pytest.fixture(scope="module")
def oracle_available():
    reason = oracle_missing_reason()
    if reason:
        pytest.skip(reason)


def test_v0_scheduler_matches_vllm_053_step_by_step(oracle_available):
    scenarios = hand_written_scenarios() + random_scenarios(NUM_RANDOM_SCENARIOS, base_seed=0)
    diffs, summary = run_all(scenarios)
    assert diffs == [], f"{len(diffs)} differences; first: {diffs[:5]}"
    assert summary["scenarios"] == NUM_RANDOM_SCENARIOS + len(hand_written_scenarios())
    # The scenarios must really exercise the paths compared.
    assert summary["preemptions"] > 200
    assert summary["swap_outs"] > 20
    assert summary["ignored"] > 50
    assert summary["aborted_runs"] > 0


def test_compare_reports_a_divergence():
    """The comparison itself can fail: a doctored trace is reported at its step."""
    scenario = hand_written_scenarios()[0]
    ours = run_ours(scenario)
    theirs = {**ours, "steps": [dict(s) for s in ours["steps"]]}
    theirs["steps"][2]["free_gpu_blocks"] += 1
    diffs = compare(scenario, ours, theirs)
    assert len(diffs) == 1 and "step 2 field 'free_gpu_blocks'" in diffs[0]
