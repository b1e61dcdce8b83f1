"""The v0 starvation scenario end to end (one repeat instead of three): the
baseline's waiting queue never drains and the path counters name head-of-line
blocking; removing the long prompts drains it; the controls that leave the
cause in place do not; every threshold of the scenario file holds."""

import io
import logging

import pytest
from rich.console import Console

from bench.runner import run_scenario
from bench.scenario import load_scenario
from bench.v0_report import longest_nonempty_waiting, queue_verdict, v0_report
from engine.records import StepRecord


@pytest.fixture(scope="module")
def outcome_and_report():
    logging.getLogger("vllm.v0").setLevel(logging.ERROR)  # no preemption warnings on stderr
    try:
        scenario = load_scenario("v0-starvation").with_overrides({"repeats": 1})
        console = Console(file=io.StringIO(), width=200)
        outcome = run_scenario(scenario, console=console)
        renderable, data = v0_report(outcome.results, outcome.runs, scenario)
        console.print(renderable)
        _, from_results_only = v0_report(outcome.results, {}, scenario)  # e.g. from saved results JSON
        yield outcome, data, console.file.getvalue(), from_results_only
    finally:
        logging.getLogger("vllm.v0").setLevel(logging.NOTSET)


def test_every_threshold_of_the_scenario_holds(outcome_and_report):
    outcome, _, _, _ = outcome_and_report
    assert outcome.invariant_errors == []
    failed = [o.text for o in outcome.threshold_outcomes if not o.passed]
    assert failed == [] and len(outcome.threshold_outcomes) >= 15
    assert outcome.exit_code == 0


def test_the_report_reproduces_diagnoses_and_remedies(outcome_and_report):
    _, data, text, from_results_only = outcome_and_report
    v = data["variants"]
    assert v["baseline"]["run_record"]["queue_verdict"] == "never drains"
    assert v["baseline"]["diagnosis"]["dominant_path"] == "head-of-line"
    assert v["no-long"]["run_record"]["queue_verdict"] == "drains"
    for control in ("budget-4096", "chunked", "swap-0", "v1"):  # the cause left in place
        assert v[control]["run_record"]["queue_verdict"] in ("never drains", "backlogged"), control
    base = v["baseline"]["run_record"]
    assert base["engine"] == "v0" and base["scheduling_policy"] == "fcfs" and base["preemption_mode"] == "swap"
    assert (base["num_gpu_blocks"], base["num_cpu_blocks"], base["block_size"]) == (256, 2048, 16)
    assert base["num_prompts"] == 512 and base["prompt_len_max"] == 1536
    assert base["num_preemptions"] == base["num_preemptions_swap"] > 0 and base["num_ignored_prompts"] == 0
    assert base["ttft_p99_ms"] > 5 * v["no-long"]["run_record"]["ttft_p99_ms"]
    assert v["v1"]["diagnosis"] is None and v["v1"]["run_record"]["engine"] == "v1"
    assert v["swap-0"]["diagnosis"]["scores"]["preempt-reinsert"] > 0
    assert "waiting queue drains in: no-long; never drains in: baseline, budget-4096" in text
    # Without the runs (only the results files), the v0 node counters give the same verdicts.
    only = from_results_only["variants"]
    assert [only[k]["run_record"]["queue_verdict"] for k in ("baseline", "no-long")] == ["never drains", "drains"]
    assert (
        only["baseline"]["diagnosis"] == v["baseline"]["diagnosis"]
        and only["v1"]["run_record"]["queue_verdict"] is None
    )


def test_the_queue_verdict_reads_the_step_records():
    def step(t, waiting):
        return StepRecord("n", t, 0, 1, 1, 0, 1, 1, waiting, 0, 0, 0, 10, 1, 0, 0)

    steps = [step(0, 0), step(1, 3), step(2, 5), step(6, 1), step(7, 0), step(8, 2), step(9, 0)]
    assert longest_nonempty_waiting(steps) == 5.0
    assert [queue_verdict(5.0, d) for d in (10.0, 12.0, 21.0)] == ["never drains", "backlogged", "drains"]
