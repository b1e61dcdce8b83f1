"""P/D differential conformance against vLLM 0.33.0: schedulers with a KV
connector in each role (consumer, producer, both), fed identical worker
reports (loads finishing late, failing wholly or by block, sends), compared
step by step with the connector's view (loads and sends announced, held
requests, completed and failed loads). `make conformance` runs 500 random ones;
this runs the hand-written P/D scenarios and 96 random ones (every role x
policy x guard combination 8 times). Skipped when the oracle venv is absent.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import v1_harness  # noqa: E402
from pd_generate import generate_pd_suite  # noqa: E402
from pd_handwritten import all_pd_handwritten  # noqa: E402

# The module fixture replays the whole suite in one oracle call: pytest's
# default 300 s (pyproject.toml) is too short for it on a loaded machine, so
# the tests wait as long as the call itself may take (`run_driver`).
pytestmark = [pytest.mark.oracle, pytest.mark.timeout(v1_harness.launch.DRIVER_TIMEOUT_S + 60)]

PD_COUNT = 96


@pytest.fixture(scope="module")
def pd_result():
    skip = v1_harness.oracle_skip_message()
    if skip:
        pytest.skip(skip)
    hand = all_pd_handwritten()
    scenarios = [s for s, _ in hand] + generate_pd_suite(PD_COUNT)
    expectations = {s["id"]: e for s, e in hand}
    return v1_harness.run_harness(scenarios, expectations, out_dir=v1_harness.DEFAULT_OUT)


def test_every_pd_scenario_matches_vllm_step_by_step(pd_result):
    report = pd_result.mismatch_report()
    if report:
        pytest.fail(report, pytrace=False)
    assert pd_result.matched == len(pd_result.scenarios)


def test_pd_handwritten_facts_hold_on_vllm_and_ours(pd_result):
    assert pd_result.expectation_failures == []


def test_every_role_policy_and_guard_is_covered(pd_result):
    random = [s for s in pd_result.scenarios if s["id"].startswith("pd-")]
    groups = v1_harness.pd_groups(random)
    assert len(groups) == 3 * 2 * 2
    assert all(len(g) == PD_COUNT // 12 for g in groups.values()), {k: len(g) for k, g in groups.items()}


def test_random_pd_scenarios_exercise_the_connector_paths(pd_result):
    """The generator must keep producing what the P/D harness exists for."""
    by_id = {s["id"]: s for s in pd_result.scenarios if s["id"].startswith("pd-")}
    cov = v1_harness.pd_coverage([t for t in pd_result.oracle_traces if t["id"] in by_id], by_id)
    for key in ("remote_load", "late_load", "held_for_send", "fence_on"):
        assert cov[key] >= PD_COUNT // 4, cov
    for key in ("load_after_local_hit", "invalid_blocks", "failed_recving", "load_error_finish"):
        assert cov[key] >= 5, cov
    for key in ("abort_while_loading", "abort_while_held", "preempted_after_load"):
        assert cov[key] >= 5, cov
