"""Builds the optional compiled engine (mypyc) into build/compiled/, never
into the source tree: a plain checkout stays pure Python, the reference.

    .venv/bin/python tools/build_compiled.py [--force]   # = make compiled
    DISAGG_SIM_COMPILED=1 .venv/bin/disagg-sim ...       # uses it (engine/compiled.py)

mypyc ships in the mypy wheel the `[test]` extra pins, so this needs no new
dependency; it needs a C compiler and the interpreter's headers. Without a
compiler the build fails soft: a note on stderr, exit 0 (an earlier build
stays, used only while its sources match). A module mypyc refuses is a
hard failure (exit 1): the list below is what is known to compile.

The build records a hash of every module in the compiled packages, compiled
or not (build/compiled/manifest.json); engine/compiled.py refuses a build
whose sources have changed since. docs/compiled.md says what is compiled and why.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "compiled"

# The in-process runtime's hot path is flat (cProfile of a 1P+1D run: no
# module above ~7 % of the time), and a call from compiled code into an
# interpreted module, or an attribute read on an interpreted class, runs at
# interpreted speed: so everything a simulated step touches is compiled
# together, in one mypyc group.
INCLUDE = [
    "engine/*.py",
    "engine/kv_connector/*.py",
    "node/*.py",
    "proxy/*.py",
    "decode_node/*.py",
    "prefill_node/*.py",
    "connector/kv_timing.py",
    "connector/link.py",
    "connector/payload.py",
    "connector/pull_policy.py",
    "connector/stage_pipeline.py",
    "cluster/inproc/*.py",
]
# Left interpreted (docs/compiled.md, "What is compiled"):
EXCLUDE = {
    # `PromptTokens.__getattr__` (a lazily built attribute) on a Sequence
    # subclass: mypyc supports __getattr__ only in native classes, which
    # cannot inherit from collections.abc.Sequence.
    "engine/prompt.py",
    # TokenIds subclasses collections.abc.Sequence: mypyc 2.4.1 builds the
    # class without ABCMeta's own registry, so it shares Sequence's and
    # isinstance(a_list, TokenIds) comes out True.
    "engine/token_ids.py",
    # ShadowKVStore inherits from DecodeChains, whose class body declares
    # methods under `if TYPE_CHECKING:` (mypyc refuses the statement); the
    # shadow KV store is off in every benchmarked configuration.
    "engine/shadow_kv.py",
    "engine/shadow_kv_decode.py",
    # FCFSRequestQueue subclasses collections.deque: mypyc 2.4.1 compiles it
    # without complaint, but constructing one crashes the interpreter
    # (a segmentation fault in deque's __init__).
    "engine/request_queue.py",
    # The conformance harness (tests/conformance/v1_play.py) wraps a
    # KVCacheManager's allocate_slots on the instance, to count the calls
    # and fail the Nth as vLLM's tests do; a compiled class's methods cannot
    # be replaced on an instance.
    "engine/kv_cache_manager.py",
    # Test helpers; the loader of the build itself (it runs before the build is in place).
    "engine/testing.py",
    "engine/compiled.py",
    # connector/transport.py: its exceptions subclass KeyError (mypyc: not
    # a native base); the grpc/ side is the Ray runtime's. engine/v0: the
    # legacy scheduler, not in the benchmarked configurations.
}


def watched() -> list[str]:
    """Every module in the compiled packages, compiled or not: the compiled
    ones were type-checked against the others (and may have inlined their
    constants), so a change to any of them makes the build stale."""
    return sorted({p for pat in INCLUDE for p in glob.glob(pat, root_dir=REPO)})


def sources() -> list[str]:
    """The modules compiled."""
    return [p for p in watched() if not p.endswith("__init__.py") and p not in EXCLUDE]


def source_hashes(paths: list[str]) -> dict[str, str]:
    return {p: hashlib.sha256((REPO / p).read_bytes()).hexdigest() for p in paths}


def _compiler() -> str | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def _soft_fail(why: str) -> None:
    # An earlier build is left as it is: engine/compiled.py uses it only
    # while its sources match.
    print(
        f"note: the compiled engine was NOT built ({why}); the pure Python engine is unaffected, "
        "and `make test-compiled` skips unless an earlier build is there",
        file=sys.stderr,
    )
    sys.exit(0)


def main() -> None:
    if _compiler() is None:
        _soft_fail(f"no C compiler: {sysconfig.get_config_var('CC')!r} is not on PATH")
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        _soft_fail(f"no Python headers at {include}")
    from mypyc.build import mypycify
    from setuptools import Distribution

    os.chdir(REPO)
    paths = sources()
    if _up_to_date(paths) and "--force" not in sys.argv[1:]:
        print(f"the compiled build in {OUT} is up to date ({len(paths)} modules; --force rebuilds it)")
        return
    t0 = time.perf_counter()
    shutil.rmtree(OUT, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="disagg-sim-mypyc-") as tmp:
        # multi_file: one C file per module, so build_ext compiles them in parallel.
        exts = mypycify(paths, opt_level="3", multi_file=True, target_dir=tmp, group_name="disagg_sim_engine")
        dist = Distribution({"name": "disagg-sim-compiled", "ext_modules": exts})
        build = dist.get_command_obj("build_ext")
        build.build_lib = str(OUT / "lib")
        build.build_temp = str(Path(tmp) / "obj")
        build.parallel = os.cpu_count() or 1
        try:
            dist.run_command("build_ext")
        except Exception as e:  # distutils' CompileError / LinkError: the environment's compiler
            _soft_fail(f"the C compiler failed: {e}")
    modules = sorted(
        str(p.relative_to(OUT / "lib")).split(".")[0].replace("/", ".") for p in (OUT / "lib").rglob("*.so")
    )
    manifest = {
        "sources": source_hashes(watched()),
        "compiled": paths,
        "modules": modules,
        "python": sys.version.split()[0],
        "mypy": _mypy_version(),
        "build_seconds": round(time.perf_counter() - t0, 1),
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"compiled {len(paths)} modules into {OUT} in {manifest['build_seconds']} s (mypyc {manifest['mypy']})")


def _up_to_date(paths: list[str]) -> bool:
    """The build holds these modules, built from these sources, by this interpreter."""
    try:
        manifest = json.loads((OUT / "manifest.json").read_text())
    except FileNotFoundError:
        return False
    return (
        manifest.get("compiled") == paths
        and manifest["sources"] == source_hashes(watched())
        and manifest["python"] == sys.version.split()[0]
    )


def _mypy_version() -> str:
    out = subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True, text=True)
    return out.stdout.split()[1] if out.returncode == 0 else "?"


if __name__ == "__main__":
    main()
