"""Where a result came from: the tool, the code, the libraries and the machine.

Written into every results JSON (`provenance`) next to the resolved scenario,
so a result file alone says what produced it and can be re-run
(`disagg-sim run RESULT.json`). Collected once per `run` command.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from engine.compiled import build_label

REPO_ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("ray", "grpcio", "protobuf", "pydantic", "numpy", "matplotlib", "rich")


def tool_version() -> str:
    try:
        return metadata.version("disagg-sim")
    except metadata.PackageNotFoundError:  # run from a checkout without installing
        return "unknown"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip()


@functools.lru_cache(maxsize=1)
def git_state() -> dict:
    """The commit the code is at and whether the tree had local changes (None outside a git checkout)."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def collect(argv: list[str] | None = None) -> dict:
    """Everything but the scenario: stable within one `run` command."""
    return {
        "tool": "disagg-sim",
        "version": tool_version(),
        "git": git_state(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        # "pure", or the compiled build that ran (DISAGG_SIM_COMPILED; docs/compiled.md).
        "engine_build": build_label(),
        "libraries": library_versions(),
        "machine": {
            "hostname": platform.node(),
            "system": platform.system(),
            "release": platform.release(),
            "arch": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "argv": list(sys.argv if argv is None else argv),
        "started_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
