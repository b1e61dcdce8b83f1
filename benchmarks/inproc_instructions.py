"""Instructions the in-process runtime executes (issue 15), counted by
valgrind's callgrind: a figure this shared 2-core machine cannot move, where
wall and CPU times of one configuration vary by up to 1.9x from run to run
(benchmarks/RESULTS.md). Use it to compare two trees, or one tree's
configurations, when a few per cent matter.

    .venv/bin/python -m benchmarks.inproc_instructions [--requests 2000] [--old-commit C] [--record]

Each count runs `benchmarks/inproc_speed.py --child` under callgrind twice,
with and without the run itself (`"dry"`: imports, workload and spec only),
and reports the difference: the run's own instructions. The workloads and
cluster settings are inproc_speed's (W1 and W2; aggregated with shadow KV
off and on, and 1 prefill + 1 decode node; `--prefix-caching` as there);
`--old-commit` adds the old tree's aggregated shadow-off runs, checked out in
a temporary worktree.
Python's hash randomisation moves a count by well under 0.1 %. Slow: about
45 s per 1,000 requests and count. Needs valgrind (Debian package `valgrind`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import inproc_speed

CONFIGS = [("agg", False), ("agg", True), ("1P1D", False)]


def instructions(tree: Path, workload_file: str, cluster: dict, dry: bool) -> int:
    payload = json.dumps({"workload_file": workload_file, "cluster": cluster, "dry": dry})
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [sys.executable, str(inproc_speed.HERE), "--child", payload]
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None or "RESULT " not in proc.stdout:
        raise RuntimeError(f"callgrind run in {tree} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return int(found.group(1))


def run_instructions(tree: Path, workload_file: str, cluster: dict) -> int:
    """The run's own instructions: the whole child less the same child without the run."""
    return instructions(tree, workload_file, cluster, False) - instructions(tree, workload_file, cluster, True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--old-commit", default=None, help="count this commit's aggregated shadow-off runs too")
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--prefix-caching", action="store_true", help="prefix caching on (inproc_speed.py's flag)")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed; install the Debian package `valgrind`")
    names = [w for w in args.workloads.split(",") if w]
    for w in names:
        if w not in inproc_speed.WORKLOADS:
            raise SystemExit(f"--workloads: {w!r} is unknown; allowed: {', '.join(inproc_speed.WORKLOADS)}")
    if args.requests < 1:
        raise SystemExit(f"--requests={args.requests} is invalid; allowed: >= 1")
    commit = subprocess.run(
        ["git", "-C", str(inproc_speed.REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    status = ["git", "-C", str(inproc_speed.REPO), "status", "--porcelain", "--untracked-files=no"]
    if subprocess.run(status, capture_output=True, text=True).stdout.strip():
        commit += " + uncommitted changes"
    old_tree = inproc_speed._worktree(args.old_commit) if args.old_commit else None
    counts: dict[tuple[str, str, bool, str], int] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for w in names:
                wl = f"{tmp}/{w}.json"
                Path(wl).write_text(json.dumps(inproc_speed.workload_rows(w, args.requests)))
                for topo, shadow in CONFIGS:
                    sides = [("new", inproc_speed.REPO)]
                    if old_tree is not None and topo == "agg" and not shadow:
                        sides.insert(0, ("old", old_tree))
                    for side, tree in sides:
                        old = side == "old"
                        cluster = inproc_speed.cluster_dict(topo, shadow, old=old, caching=args.prefix_caching)
                        n = counts[(w, topo, shadow, side)] = run_instructions(tree, wl, cluster)
                        print(f"{w} {topo} shadow={'on' if shadow else 'off'} {side}: {n:,} instructions", flush=True)
    finally:
        if old_tree is not None:
            inproc_speed._drop_worktree(old_tree)
    text = _entry(args, counts, names, commit)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry("## In-process runtime instructions (benchmarks/inproc_instructions.py)", text)


def _entry(args, counts: dict, names: list[str], commit: str) -> str:
    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — W1/W2, {args.requests} requests, instructions"
        + (f", against {args.old_commit}" if args.old_commit else ""),
        "",
        f"Tree: {commit}. Settings of inproc_speed.py, prefix caching {'**on**' if args.prefix_caching else 'off'}. "
        f"Command: `.venv/bin/python -m benchmarks.inproc_instructions --requests {args.requests}"
        + (f" --old-commit {args.old_commit}" if args.old_commit else "")
        + (f" --workloads {args.workloads}" if args.workloads != "W1,W2" else "")
        + (" --prefix-caching" if args.prefix_caching else "")
        + " --record`.",
        "",
        "| workload | nodes | shadow KV | tree | instructions (millions) |",
        "|---|---|---|---|---:|",
    ]
    for (w, topo, shadow, side), n in counts.items():
        lines.append(f"| {w} | {topo} | {'on' if shadow else 'off'} | {side} | {n / 1e6:,.0f} |")
    lines.append("")
    for w in names:
        off = counts[(w, "agg", False, "new")]
        if (w, "agg", False, "old") in counts:
            old = counts[(w, "agg", False, "old")]
            lines.append(f"- {w}: {args.old_commit} / current (aggregated, shadow off): {old / off:.2f}x")
        lines.append(f"- {w}: shadow on / off (aggregated): {counts[(w, 'agg', True, 'new')] / off:.3f}x")
        lines.append(f"- {w}: 1P+1D / aggregated (shadow off): {counts[(w, '1P1D', False, 'new')] / off:.3f}x")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
