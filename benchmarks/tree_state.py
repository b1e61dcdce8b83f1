"""What a benchmark entry says about where it ran: the tree measured and the
machine (shared by the benchmarks that record into RESULTS.md)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tree_label(repo: Path = REPO) -> str:
    """The short commit, with " + uncommitted changes" when tracked files differ
    from it; benchmarks/RESULTS.md aside (an entry recorded just before is not
    a change to what is measured)."""
    git = ["git", "-C", str(repo)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    status = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/RESULTS.md"],
        capture_output=True,
        text=True,
    )
    return commit + (" + uncommitted changes" if status.stdout.strip() else "")


def machine_line() -> str:
    """The machine and its load average now (at the end of the measurement)."""
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}; "
        f"load average at the end {load}."
    )
