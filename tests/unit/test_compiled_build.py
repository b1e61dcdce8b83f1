"""engine/compiled.py: a compiled build is used only when asked for, only when
its sources are the tree's, and never mixed with modules already imported
from source; under `make test-compiled` the engine really runs compiled.

Each case starts a fresh interpreter: installing a build changes the
process's import system for good."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import compiled

REPO = Path(__file__).resolve().parents[2]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _import_engine(build: Path | str) -> subprocess.CompletedProcess:
    code = "import engine.compiled as c; print('LABEL', c.build_label())"
    env = dict(os.environ, DISAGG_SIM_COMPILED=str(build), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)


def _fake_build(root: Path, sources: dict[str, str], modules: list[str]) -> Path:
    (root / "lib").mkdir(parents=True)
    for m in modules:
        f = root / "lib" / (m.replace(".", "/") + SUFFIX)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"")
    manifest = {"sources": sources, "modules": modules, "python": "3", "mypy": "x"}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def _digest(path: str) -> str:
    import hashlib

    return hashlib.sha256((REPO / path).read_bytes()).hexdigest()


def test_without_the_variable_the_engine_is_pure() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DISAGG_SIM_COMPILED"}
    code = "import engine.scheduler as s, engine.compiled as c; print('LABEL', c.build_label(), s.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "LABEL pure " in out.stdout and out.stdout.strip().endswith("engine/scheduler.py")


def test_a_missing_build_is_refused(tmp_path: Path) -> None:
    out = _import_engine(tmp_path / "nothing-here")
    assert out.returncode != 0
    assert "StaleBuildError" in out.stderr and "no compiled build at" in out.stderr and "make compiled" in out.stderr


def test_a_build_of_other_sources_is_refused(tmp_path: Path) -> None:
    build = _fake_build(tmp_path / "b", {"engine/scheduler.py": "0" * 64}, ["engine.scheduler"])
    out = _import_engine(build)
    assert out.returncode != 0
    assert "is stale: engine/scheduler.py" in out.stderr


def test_a_build_missing_a_module_file_is_refused(tmp_path: Path) -> None:
    build = _fake_build(tmp_path / "b", {"engine/scheduler.py": _digest("engine/scheduler.py")}, ["engine.scheduler"])
    (build / "lib" / ("engine/scheduler" + SUFFIX)).unlink()
    out = _import_engine(build)
    assert out.returncode != 0
    assert "has no" in out.stderr and "engine.scheduler" in out.stderr


def test_a_module_already_imported_from_source_is_refused(tmp_path: Path) -> None:
    # engine/compiled.py itself imports json before it installs the build: a
    # build claiming json would be mixed with the source one already loaded.
    build = _fake_build(tmp_path / "b", {"engine/scheduler.py": _digest("engine/scheduler.py")}, ["json"])
    out = _import_engine(build)
    assert out.returncode != 0
    assert "json imported from source before the compiled build" in out.stderr


@pytest.mark.skipif(
    os.environ.get(compiled.ENV, "") in ("", "0"), reason="runs under `make test-compiled` (DISAGG_SIM_COMPILED=1)"
)
def test_under_make_test_compiled_the_hot_modules_are_the_compiled_ones() -> None:
    """The compiled suites must not pass by running the pure modules."""
    import cluster.inproc.cluster
    import engine.scheduler
    import node.step_loop
    import proxy.proxy

    assert compiled.build_label().startswith("compiled (mypyc")
    for module in (engine.scheduler, node.step_loop, proxy.proxy, cluster.inproc.cluster):
        assert module.__file__ is not None and module.__file__.endswith(SUFFIX), module.__file__
    from bench.provenance import collect

    assert collect([])["engine_build"] == compiled.build_label()


# One process per build: W1's first 300 requests, aggregated with prefix
# caching off and on and 1P+1D, shadow KV on; everything a run returns but
# its event count (the loop's own statistic) hashed.
_DIGEST_CHILD = """
import hashlib, json
from benchmarks import inproc_speed as s
from cluster.inproc import run_inproc
from cluster.spec import ClusterSpec
from engine.compiled import build_label
from engine.records import WorkloadRequest

digest = hashlib.sha256()
for topology, caching in (("agg", False), ("agg", True), ("1P1D", False)):
    work = [WorkloadRequest(*row) for row in s.workload_rows("W1", 300)]
    spec = ClusterSpec.model_validate(s.cluster_dict(topology, shadow=True, old=False, caching=caching))
    r = run_inproc(spec, work, seed=0)
    whole = {
        "duration": r.duration,
        "requests": [q.to_dict() for q in r.requests],
        "steps": [q.to_dict() for q in r.steps],
        "node_counters": r.node_counters,
        "violations": r.violations,
        "invariant_errors": r.invariant_errors,
        "extra": {k: v for k, v in r.extra.items() if k != "num_events"},
    }
    digest.update(json.dumps(whole, sort_keys=True, default=repr).encode())
print("DIGEST", build_label(), digest.hexdigest())
"""


def _build_is_current() -> bool:
    try:
        manifest = json.loads((compiled.DEFAULT_DIR / "manifest.json").read_text())
    except FileNotFoundError:
        return False
    return all(_digest(p) == h for p, h in manifest["sources"].items())


@pytest.mark.skipif(not _build_is_current(), reason="no current compiled build (make compiled)")
def test_the_compiled_build_gives_the_pure_builds_results_bit_for_bit() -> None:
    out = {}
    for value in ("0", "1"):
        env = dict(os.environ, DISAGG_SIM_COMPILED=value, PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [sys.executable, "-c", _DIGEST_CHILD], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("DIGEST "))
        out[value] = line.split()[-1], line
    assert out["0"][1].startswith("DIGEST pure ") and out["1"][1].startswith("DIGEST compiled (mypyc")
    assert out["0"][0] == out["1"][0]
