"""Variant comparison table and the threshold language, with exit codes."""

import io

import pytest
from rich.console import Console

from bench.compare import format_compare_table, main_compare, summarize
from bench.results import build_result, write_run
from bench.thresholds import ThresholdError, evaluate_thresholds, parse_threshold
from engine.records import RequestRecord

# variant -> per-repeat (num_preemptions, num_zero_progress_preemptions, ttft seconds)
RUNS = {
    "fixed": [(2, 0, 0.5), (4, 0, 1.5)],
    "prefix": [(40, 10, 1.0), (60, 30, 3.0)],
}


def make_results():
    out = []
    for variant, reps in RUNS.items():
        for rep, (pre, zp, ttft) in enumerate(reps):
            rec = RequestRecord(
                "a", 0.0, 10, 2, token_times=[ttft, ttft + 0.1], finish_time=ttft + 0.1, finish_reason="length"
            )
            counters = {"n0": {"num_preemptions": pre, "num_zero_progress_preemptions": zp}}
            out.append(
                build_result(
                    records=[rec], scenario="s", variant=variant, clock="virtual", repeat=rep, counters_by_node=counters
                )
            )
    return out


@pytest.fixture
def result_dir(tmp_path):
    for r in make_results():
        write_run(tmp_path, r)
    return tmp_path


def run(paths, thresholds, **kw):
    buf = io.StringIO()
    code = main_compare([str(p) for p in paths], thresholds, console=Console(file=buf, width=200), **kw)
    return code, buf.getvalue()


def test_summary_mean_std_and_ratio_of_means():
    baseline, metrics, table = summarize(make_results(), metrics=["num_preemptions", "mean_ttft_ms"])
    assert baseline == "fixed"
    pre = table["prefix"]["num_preemptions"]
    assert (pre.mean, pre.n) == (50.0, 2)
    assert pre.std == pytest.approx(14.142135623730951)  # sample std of 40, 60
    assert pre.ratio == pytest.approx(50 / 3)  # the ratio of the means, as a threshold m[a] / m[b] computes
    assert table["fixed"]["num_preemptions"].ratio is None
    assert table["prefix"]["mean_ttft_ms"].ratio == pytest.approx(2.0)
    text = io.StringIO()
    Console(file=text, width=200).print(format_compare_table(baseline, metrics, table))
    assert "50 ± 14.14 (×16.67)" in text.getvalue()


def test_all_thresholds_pass_exit_0(result_dir):
    code, out = run(
        [result_dir],
        [
            "num_zero_progress_preemptions[fixed] == 0",
            "num_preemptions[prefix] / num_preemptions[fixed] >= 10",
            "p99_ttft_ms[fixed] <= 2000",
            "max(num_preemptions[fixed]) == 4",
            "min(num_zero_progress_preemptions[prefix]) > 0",
        ],
    )
    assert code == 0, out
    assert "5 passed, 0 failed" in out and "FAIL" not in out


def test_failing_threshold_exit_1_and_named(result_dir):
    code, out = run([result_dir], ["num_zero_progress_preemptions[prefix] == 0", "p99_ttft_ms[fixed] <= 2000"])
    assert code == 1
    assert "1 passed, 1 failed" in out
    assert "FAIL" in out and "num_zero_progress_preemptions[prefix] == 0" in out


@pytest.mark.parametrize(
    "threshold, message",
    [
        ("p99_ttft_ms[fixed] <=", "expected a number, metric[variant]"),
        ("p99_tfft_ms[fixed] <= 1", "unknown metric 'p99_tfft_ms' for variant 'fixed'; did you mean p99_ttft_ms"),
        ("p99_ttft_ms[fixd] <= 1", "unknown variant 'fixd'; did you mean fixed?; known: fixed, prefix"),
        ("__import__('os')[x] > 1", "unexpected character"),
    ],
)
def test_bad_threshold_exit_2(result_dir, threshold, message):
    code, out = run([result_dir], [threshold])
    assert code == 2
    assert message in " ".join(out.split()), out


def test_unknown_baseline_and_missing_results(tmp_path, result_dir):
    code, out = run([result_dir], [], baseline="nope")
    assert code == 2 and "unknown baseline variant 'nope'" in out
    code, out = run([tmp_path / "none.json"], [])
    assert code == 2 and "result file not found" in out


def test_no_thresholds_exit_0(result_dir):
    code, out = run([result_dir], [])
    assert code == 0 and "num_preemptions" in out and "0 passed, 0 failed" in out


def test_arithmetic_precedence_and_division_by_zero():
    results = make_results()
    [o] = evaluate_thresholds(results, ["1 + 2 * 3 - -1 == 8"])
    assert o.passed and o.lhs == 8.0
    [o] = evaluate_thresholds(results, ["(1 + 2) * 3 == 9"])
    assert o.passed
    # mean zero-progress of fixed is 0: x / 0 is +inf for x > 0, and 0 / 0 is NaN which fails everything.
    inf, nan = evaluate_thresholds(
        results,
        [
            "num_preemptions[prefix] / num_zero_progress_preemptions[fixed] >= 10",
            "num_zero_progress_preemptions[fixed] / num_zero_progress_preemptions[fixed] >= 0",
        ],
    )
    assert inf.passed and inf.lhs == float("inf")
    assert not nan.passed


def test_parse_errors_point_at_the_column():
    with pytest.raises(ThresholdError) as exc:
        parse_threshold("a[b] >= 1 1")
    assert str(exc.value).splitlines()[-1] == "  " + " " * 10 + "^"
    with pytest.raises(ThresholdError, match="unknown function; allowed: mean, min, max, median, std"):
        parse_threshold("p95(a[b]) > 1")
    with pytest.raises(ThresholdError, match="expected a comparison"):
        parse_threshold("a[b] + 1")


def test_every_comparator_at_its_boundary():
    # max num_preemptions of fixed is exactly 4.
    texts = [f"max(num_preemptions[fixed]) {op} 4" for op in ("==", "!=", "<=", ">=", "<", ">")]
    outcomes = evaluate_thresholds(make_results(), texts)
    assert [o.passed for o in outcomes] == [True, False, True, True, False, False]
