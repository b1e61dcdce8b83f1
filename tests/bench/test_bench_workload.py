"""Workload specs: determinism, distribution sanity, validation messages."""

from pathlib import Path

import numpy as np
import pytest

from bench.workloads import (
    WorkloadSpecError,
    generate_workload,
    load_empirical_cdf,
    parse_workload_spec,
)
from bench.workloads.lengths import EmpiricalCDFError

DATA = Path(__file__).resolve().parents[1] / "data"


def spec(**overrides):
    base = {
        "num_requests": 200,
        "seed": 3,
        "prompt_len": {"kind": "uniform", "low": 10, "high": 20},
        "output_len": {"kind": "lognormal", "mu": 4.0, "sigma": 0.5},
        "arrival": {"kind": "poisson", "rate": 10.0},
    }
    base.update(overrides)
    return parse_workload_spec(base)


def test_same_seed_same_requests_other_seed_differs():
    a = generate_workload(spec())
    assert a == generate_workload(spec())
    b = generate_workload(spec(), seed=4)
    assert [r.prompt_len for r in a] != [r.prompt_len for r in b]


def test_parts_draw_from_independent_streams():
    # Changing the arrival process must not reshuffle the lengths.
    a = generate_workload(spec())
    b = generate_workload(spec(arrival={"kind": "gamma", "rate": 3.0, "burstiness": 0.3}))
    assert [(r.prompt_len, r.output_len) for r in a] == [(r.prompt_len, r.output_len) for r in b]
    assert [r.arrival_time for r in a] != [r.arrival_time for r in b]


def test_request_ids_and_start_offset():
    reqs = generate_workload(spec(num_requests=12, start_time=5.0))
    assert [r.request_id for r in reqs[:2]] == ["req-00", "req-01"] and reqs[-1].request_id == "req-11"
    assert all(r.arrival_time > 5.0 for r in reqs)


def test_uniform_lengths_in_range_and_spread():
    reqs = generate_workload(spec(num_requests=2000))
    lens = [r.prompt_len for r in reqs]
    assert min(lens) == 10 and max(lens) == 20  # both ends reachable with 2000 draws
    assert abs(np.mean(lens) - 15) < 0.3


def test_normal_is_clipped_at_one_and_fixed_shorthand():
    reqs = generate_workload(spec(num_requests=1000, prompt_len={"kind": "normal", "mean": 2, "std": 5}, output_len=7))
    assert min(r.prompt_len for r in reqs) == 1
    assert {r.output_len for r in reqs} == {7}


def test_lognormal_median_near_exp_mu():
    reqs = generate_workload(spec(num_requests=4000))
    assert abs(np.median([r.output_len for r in reqs]) / np.exp(4.0) - 1) < 0.05


def test_sharegpt_like_respects_vllm_pruning_bounds():
    reqs = generate_workload(
        spec(
            num_requests=3000,
            prompt_len={"kind": "sharegpt_like", "part": "prompt"},
            output_len={"kind": "sharegpt_like", "part": "output"},
        )
    )
    p = [r.prompt_len for r in reqs]
    o = [r.output_len for r in reqs]
    assert min(p) >= 4 and max(p) <= 1024 and min(o) >= 4 and max(o) <= 1024
    assert 80 < np.median(p) < 140 and 170 < np.median(o) < 270


def test_poisson_is_normalized_like_vllm():
    reqs = generate_workload(spec(num_requests=100, arrival={"kind": "poisson", "rate": 4.0}))
    times = [r.arrival_time for r in reqs]
    assert times == sorted(times) and times[0] > 0
    assert times[-1] == pytest.approx(100 / 4.0, rel=1e-12)  # last arrival pinned at n / rate


def test_gamma_burstiness_changes_gap_dispersion():
    def cv(burstiness):
        reqs = generate_workload(
            spec(num_requests=4000, arrival={"kind": "gamma", "rate": 10.0, "burstiness": burstiness})
        )
        gaps = np.diff([0.0] + [r.arrival_time for r in reqs])
        return np.std(gaps) / np.mean(gaps)

    # Gamma(k) gaps have coefficient of variation 1 / sqrt(k).
    assert cv(0.25) == pytest.approx(2.0, rel=0.1)
    assert cv(4.0) == pytest.approx(0.5, rel=0.1)


def test_constant_and_all_at_once_arrivals():
    const = generate_workload(spec(num_requests=4, arrival={"kind": "constant", "rate": 2.0}))
    assert [r.arrival_time for r in const] == [0.5, 1.0, 1.5, 2.0]
    closed = spec(num_requests=4, arrival={"kind": "all_at_once"}, max_concurrency=2)
    assert closed.max_concurrency == 2
    assert {r.arrival_time for r in generate_workload(closed)} == {0.0}


def test_priorities_fixed_and_weighted_choice():
    assert {r.priority for r in generate_workload(spec(priority=3))} == {3}
    reqs = generate_workload(spec(num_requests=4000, priority={"kind": "choice", "values": [0, 5], "weights": [3, 1]}))
    share = sum(r.priority == 5 for r in reqs) / len(reqs)
    assert share == pytest.approx(0.25, abs=0.03)


def test_empirical_cdf_sampling():
    path = str(DATA / "lengths_cdf.csv")
    assert load_empirical_cdf(path) == ((16, 64, 256), (0.25, 0.75, 1.0))
    reqs = generate_workload(spec(num_requests=4000, prompt_len={"kind": "empirical", "path": path}))
    counts = {v: sum(r.prompt_len == v for r in reqs) / 4000 for v in (16, 64, 256)}
    assert counts[16] == pytest.approx(0.25, abs=0.03) and counts[64] == pytest.approx(0.5, abs=0.03)


@pytest.mark.parametrize(
    "text, message",
    [
        ("value,cdf\n16,0.5\n8,1.0\n", ":3: values must strictly increase"),
        ("16,0.5\n32,0.4\n64,1.0\n", ":2: cdf must not decrease"),
        ("16,0.5\n32,abc\n", ":2: cdf 'abc' is not a number"),
        ("16,0.5\n32,0.9\n", "last cdf is 0.9"),
        ("16,0.5,1\n", ":1: expected 2 columns"),
    ],
)
def test_empirical_cdf_errors_name_line(tmp_path, text, message):
    path = tmp_path / f"cdf_{abs(hash(text))}.csv"
    path.write_text(text)
    with pytest.raises(EmpiricalCDFError, match=message):
        load_empirical_cdf(str(path))


def test_errors_name_field_and_allowed_values():
    with pytest.raises(WorkloadSpecError) as exc:
        parse_workload_spec(
            {"num_requests": 0, "prompt_len": {"kind": "zipf"}, "output_len": {"kind": "uniform", "low": 1, "hihg": 3}}
        )
    msg = str(exc.value)
    assert "\n" not in msg  # one line
    assert "invalid workload: workload.num_requests=0: Input should be greater than or equal to 1; " in msg
    assert "workload.prompt_len: Input tag 'zipf'" in msg and "'sharegpt_like', 'empirical'" in msg
    with pytest.raises(WorkloadSpecError) as exc:
        parse_workload_spec(
            {"num_requests": 1, "prompt_len": 4, "output_len": {"kind": "uniform", "low": 1, "hihg": 3}}
        )
    assert str(exc.value) == (
        "invalid workload: workload.output_len.high: required key missing; invalid workload: "
        "workload.output_len.hihg: unknown key; did you mean high? (allowed: high, kind, low, max, min)"
    )


def test_cross_field_errors():
    with pytest.raises(WorkloadSpecError, match=r"high \(3\) must be >= low \(5\)"):
        spec(prompt_len={"kind": "uniform", "low": 5, "high": 3})
    with pytest.raises(WorkloadSpecError, match="weights has 1 entries but values has 2"):
        spec(priority={"kind": "choice", "values": [0, 1], "weights": [1]})
    with pytest.raises(
        WorkloadSpecError, match="workload.arrival.burstiness=0: Input should be greater than or equal to 0.001"
    ):
        spec(arrival={"kind": "gamma", "rate": 1.0, "burstiness": 0})
    with pytest.raises(WorkloadSpecError, match="workload.output_len: required key missing"):
        parse_workload_spec({"num_requests": 1, "prompt_len": 3})
