"""A sweep's run as a user runs it: `disagg-sim run` end to end on W1 (issue
15's workload: 10,000 ShareGPT-like requests, Poisson 10/s, one aggregated
node, `max_num_seqs` 128, `max_num_batched_tokens` 4096, 7,424 blocks of 16;
everything else the scenario defaults, prefix caching on as in vLLM), from
the command to the last file written: start-up, the run, the results JSON,
the step trace, the plots and report.html.

    .venv/bin/python -m benchmarks.cli_speed [--requests 10000] [--repeats 3] [--old-commit C] [--record]
        [--scenario FILE]

`--scenario FILE` times that scenario file instead (all its variants and
repeats; e.g. scenarios/frozen-workload.yaml, whose decode node uses async
scheduling); the run's own time is then the sum over its runs.

Each run is a fresh `python -m bench.cli run` process with `PYTHONPATH` at
the tree to time, writing into a new temporary directory. The run's own
time is the result's `extra.wall_seconds` (the simulation); the rest is
what the command does around it. `--old-commit C` checks C out in a
temporary worktree and times it interleaved with the current tree (old,
new, old, new, ...). `--record` adds the figures to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from benchmarks import inproc_speed
from benchmarks.tree_state import machine_line, tree_label

SECTION = "## CLI run end to end (benchmarks/cli_speed.py)"


def scenario(requests: int) -> dict:
    engine = {"num_gpu_blocks": 7424, "block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 4096}
    return {
        "name": "w1-cli",
        "description": "issue 15's W1 as a scenario file (benchmarks/cli_speed.py)",
        "runtime": "inproc",
        "cluster": {"prefill": {"count": 0}, "decode": {"count": 1, "engine": engine}},
        "workload": {"num_requests": requests, **inproc_speed.WORKLOADS["W1"]},
        "repeats": 1,
    }


def time_cli(tree: Path, scenario_file: Path) -> dict:
    """One `disagg-sim run` of the scenario in a fresh process: wall seconds, and the run's own."""
    with tempfile.TemporaryDirectory(prefix="cli-speed-") as out:
        cmd = [sys.executable, "-m", "bench.cli", "run", str(scenario_file), "--out", f"{out}/run"]
        env = dict(os.environ, PYTHONPATH=str(tree))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"disagg-sim run in {tree} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        results = [json.loads(f.read_text()) for f in sorted(Path(f"{out}/run").glob("*__r*.json"))]
        if not results:
            raise RuntimeError(f"disagg-sim run in {tree} wrote no results")
        commit = results[0]["provenance"].get("git", {}).get("commit")
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
        if commit != head.stdout.strip():
            raise RuntimeError(f"the run in {tree} reports commit {commit}, not the tree's {head.stdout.strip()}")
        return {
            "wall_s": wall,
            "run_s": sum(r["extra"]["wall_seconds"] for r in results),
            "completed": sum(r["completed"] for r in results),
            "steps": sum(n["num_steps"] for r in results for n in r["steps_per_node"].values()),
            "commit": commit,
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--old-commit", default=None, help="time this commit interleaved with the current tree")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--scenario", type=Path, default=None, help="time this scenario file instead of W1")
    args = ap.parse_args()
    if args.scenario is not None and not args.scenario.is_file():
        raise SystemExit(f"--scenario {args.scenario}: no such file")
    if args.requests < 1 or args.repeats < 1:
        raise SystemExit("--requests and --repeats must be >= 1")
    old_tree = inproc_speed._worktree(args.old_commit) if args.old_commit else None
    sides = ([("old", old_tree)] if old_tree is not None else []) + [("new", inproc_speed.REPO)]
    runs: dict[str, list[dict]] = {side: [] for side, _ in sides}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            scenario_file = Path(tmp) / "w1-cli.yaml"
            if args.scenario is not None:
                scenario_file.write_text(args.scenario.read_text())  # (the same file for both trees)
            else:
                scenario_file.write_text(yaml.safe_dump(scenario(args.requests), sort_keys=False))
            for rep in range(args.repeats):
                for side, tree in sides:
                    r = time_cli(tree, scenario_file)  # type: ignore[arg-type]  # old_tree is set on the old side
                    runs[side].append(r)
                    print(
                        f"rep {rep} {side}: {r['wall_s']:.2f} s in all, the run {r['run_s']:.2f} s, "
                        f"{r['completed']} completed, {r['steps']} steps",
                        flush=True,
                    )
    finally:
        if old_tree is not None:
            inproc_speed._drop_worktree(old_tree)
    text = _entry(args, runs)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry(SECTION, text)


def _entry(args, runs: dict[str, list[dict]]) -> str:
    what = f"`{args.scenario}`" if args.scenario is not None else f"W1, {args.requests} requests,"
    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {what} through `disagg-sim run`, "
        f"median of {args.repeats}" + (f", against {args.old_commit}" if args.old_commit else ""),
        "",
        f"{machine_line()} Tree: {tree_label()}. Command: `.venv/bin/python -m benchmarks.cli_speed "
        + (f"--scenario {args.scenario}" if args.scenario is not None else f"--requests {args.requests}")
        + f" --repeats {args.repeats}"
        + (f" --old-commit {args.old_commit}" if args.old_commit else "")
        + " --record`.",
        "",
        "| tree | command wall s (median) | runs | the run s (median) | around the run s (median) |",
        "|---|---:|---|---:|---:|",
    ]
    med = {}
    for side, rs in runs.items():
        walls = [r["wall_s"] for r in rs]
        around = [r["wall_s"] - r["run_s"] for r in rs]
        med[side] = (statistics.median(walls), statistics.median(around))
        lines.append(
            f"| {side} | {med[side][0]:.2f} | {', '.join(f'{w:.2f}' for w in walls)} | "
            f"{statistics.median(r['run_s'] for r in rs):.2f} | {med[side][1]:.2f} |"
        )
    lines.append("")
    if "old" in med:
        same = {(r["completed"], r["steps"]) for rs in runs.values() for r in rs}
        lines.append(f"- The same work on both sides: {'yes' if len(same) == 1 else 'NO: ' + str(sorted(same))}")
        lines.append(
            f"- {args.old_commit} / current: {med['old'][0] / med['new'][0]:.2f}x the command, "
            f"{med['old'][1] / med['new'][1]:.2f}x around the run"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
