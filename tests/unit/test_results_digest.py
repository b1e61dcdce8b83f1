"""tools/results_digest.py: two run directories that differ only in wall
time, provenance and the scenario file's path compare equal; any other
difference is named by file and key, with exit status 1."""

from __future__ import annotations

import json
from pathlib import Path

from tools import results_digest


def _write_run(root: Path, ttft: float, wall: float, source: str) -> None:
    root.mkdir()
    result = {
        "mean_ttft_ms": ttft,
        "extra": {"wall_seconds": wall, "preemptions": 3},
        "scenario_config": {"source": source, "cluster": {"routing": "round_robin"}},
        "provenance": {"git_commit": source, "start_time": wall},
    }
    (root / "s__default__r0.json").write_text(json.dumps(result))
    (root / "s__default__r0.steps.jsonl").write_text('{"t": 0.5, "node": "decode-0"}\n{"t": 1.0, "node": "decode-0"}\n')
    (root / "report.html").write_text(f"<p>{wall}</p>")


def test_runs_that_differ_in_wall_time_and_provenance_only_are_equal(tmp_path: Path, capsys) -> None:
    _write_run(tmp_path / "before", 12.5, 1.9, "/a/s.yaml")
    _write_run(tmp_path / "after", 12.5, 1.4, "/b/s.yaml")
    assert results_digest.compare(tmp_path / "before", tmp_path / "after") == []
    assert results_digest.main([str(tmp_path / "before"), str(tmp_path / "after")]) == 0
    assert "2 files compared, all equal" in capsys.readouterr().out


def test_a_simulated_difference_is_named_by_file_and_key(tmp_path: Path, capsys) -> None:
    _write_run(tmp_path / "before", 12.5, 1.9, "/a/s.yaml")
    _write_run(tmp_path / "after", 12.75, 1.9, "/a/s.yaml")
    assert results_digest.compare(tmp_path / "before", tmp_path / "after") == [
        "s__default__r0.json: differs at [0].mean_ttft_ms: 12.5 != 12.75"
    ]
    assert results_digest.main([str(tmp_path / "before"), str(tmp_path / "after")]) == 1
    (tmp_path / "after" / "s__default__r0.steps.jsonl").unlink()
    assert results_digest.compare(tmp_path / "before", tmp_path / "after")[0].startswith(
        "s__default__r0.steps.jsonl: only in"
    )


def test_a_missing_directory_is_bad_input(tmp_path: Path, capsys) -> None:
    assert results_digest.main([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
