"""`--max-memory` (issue 34, finding 5): a run's memory is estimated before
it starts (`bench/memory_estimate.py`, calibrated by
benchmarks/memory_estimate.py); a run estimated over the limit is refused
with exit 2 and one line, and nothing is created; over half of it, a warning."""

from __future__ import annotations

import pytest

from bench.errors import InputError
from bench.memory_estimate import (
    BASE_MIB,
    PER_OUTPUT_TOKEN_KIB,
    PER_REQUEST_KIB,
    RunSize,
    estimate_mib,
    parse_size,
    scenario_sizes,
)
from bench.scenario import load_scenario
from tests.bench.cli_helpers import cli


@pytest.mark.parametrize(
    "text, size",
    [("4G", 4 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("2048", 2048 << 20), ("3000000000", 3_000_000_000)],
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "4X", "-1G", "100K", ""])
def test_bad_sizes_are_refused(text):
    with pytest.raises(InputError, match="--max-memory"):
        parse_size(text)


def test_the_estimate_is_the_largest_run_times_the_jobs():
    small, big = RunSize(1000, 100), RunSize(1_000_000, 128)
    assert small.mib == pytest.approx(BASE_MIB + 1000 * (PER_REQUEST_KIB + 100 * PER_OUTPUT_TOKEN_KIB) / 1024)
    assert estimate_mib([small, big], jobs=1) == big.mib
    assert estimate_mib([small], jobs=3) == 3 * small.mib


def test_a_scenario_s_size_comes_from_its_workload():
    scenario = load_scenario("serve").with_overrides({"workload.num_requests": 123_456})
    [size] = scenario_sizes(scenario, scenario.variant_names)
    assert size == RunSize(123_456, 128.0)  # the serve scenario's fixed output_len


def test_a_million_requests_over_the_limit_are_refused_before_anything_starts(tmp_path):
    out = tmp_path / "out"
    r = cli("run", "serve", "--set", "workload.num_requests=1000000", "--max-memory", "1G", "--out", str(out))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-memory 1,024 MiB: this run is estimated at" in lines[0]
    assert not out.exists()


def test_a_run_over_half_the_limit_is_warned_and_runs(tmp_path):
    r = cli("run", "serve", "--set", "workload.num_requests=20", "--max-memory", "200M", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "warning: this run is estimated at" in r.stdout + r.stderr
    r = cli("run", "serve", "--set", "workload.num_requests=20", "--max-memory", "off", "--out", str(tmp_path / "p"))
    assert r.returncode == 0 and "estimated" not in r.stdout + r.stderr
