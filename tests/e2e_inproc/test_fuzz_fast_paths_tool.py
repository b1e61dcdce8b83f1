"""tools/fuzz_fast_paths.py: each kind of scenario runs both ways, and a
difference is reported by seed with a failing exit status."""

from __future__ import annotations

import sys

import pytest

import engine.steady_cohort as steady_cohort
from tools import fuzz_fast_paths


@pytest.mark.parametrize("kind", fuzz_fast_paths.KINDS)
def test_each_kind_runs_both_ways_and_agrees(kind: str) -> None:
    fuzz_fast_paths.check_seed(3, kind)


def test_a_difference_is_reported_by_seed(monkeypatch, capsys) -> None:
    def differ(plain, fast) -> None:
        raise AssertionError("results differ")

    monkeypatch.setattr(fuzz_fast_paths, "assert_identical", differ)
    monkeypatch.setattr(steady_cohort, "CHECK", steady_cohort.CHECK)  # main() turns it on: put back after
    monkeypatch.setattr(sys, "argv", ["fuzz_fast_paths", "--seeds", "1", "--first-seed", "7"])
    assert fuzz_fast_paths.main() == 1
    out = capsys.readouterr().out
    assert "1 checked both ways (4 scenarios), 4 failing" in out
    for kind in ("random", "faults", "steady", "bulk"):
        assert f"seed 7 ({kind})" in out
