"""benchmarks/scenario_child.py, which inproc_instructions.py `--scenario`
runs under valgrind inside the tree it counts: run by path in a fresh
process, it takes the tree's code from `PYTHONPATH`, runs the variant (or,
dry, only loads the file) and says where its engine came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import scenario_child

REPO = Path(__file__).resolve().parents[2]

TINY = """
name: tiny
runtime: inproc
cluster: {prefill: {count: 1}, decode: {count: 1}}
workload: {num_requests: 6, prompt_len: 32, output_len: 8, arrival: {kind: poisson, rate: 50}}
variants: [{name: a}]
"""


def _child(scenario: Path, dry: bool, tmp_path: Path) -> dict:
    payload = json.dumps({"scenario": str(scenario), "variant": "a", "dry": dry})
    proc = subprocess.run(
        [sys.executable, str(scenario_child.HERE), payload],
        cwd=tmp_path,  # (not the repository: the tree comes from PYTHONPATH alone)
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_runs_the_variant_with_the_trees_code(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    for dry in (True, False):
        result = _child(scenario, dry, tmp_path)
        assert Path(result["engine_file"]).resolve().is_relative_to(REPO)
        assert result.get("requests") == (None if dry else 6)
