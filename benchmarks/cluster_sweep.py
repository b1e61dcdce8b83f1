"""A sweep of >= 64 in-process runs as Ray tasks on a local multi-node Ray
cluster (`disagg-sim run SCENARIO --address ADDR --jobs N`) against the
same sweep run one after another on this machine (`--jobs 1`): every
results JSON (less wall time and provenance) and step trace must be the
same, and the commands' wall times are recorded, interleaved (1, N, 1, N).

    .venv/bin/python -m benchmarks.cluster_sweep [--runs 64] [--requests 40] [--workers 2] [--repeats 2] [--record]

The cluster (cluster/ray/local_nodes.py): a head at 127.0.0.2 with no CPU
for runs, and `--workers` nodes of one CPU each at 127.0.0.3, ...; token
auth on; the driver of each command is a fresh `python -m bench.cli run`
process that attaches to it and ships the project's code with the job.
The scenario: tests/bench/test_parallel_runs.py's two-variant decode
scenario, `--requests` requests a run, `--runs / 2` repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from benchmarks.sweep_jobs import comparable
from benchmarks.tree_state import machine_line, tree_label

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Sweeps on a Ray cluster (benchmarks/cluster_sweep.py)"


def scenario_file(directory: Path, runs: int, requests: int) -> Path:
    from tests.bench.test_parallel_runs import TINY

    data = {
        **TINY,
        "name": f"cluster-sweep-{runs}",
        "workload": {**TINY["workload"], "num_requests": requests},
        "repeats": runs // 2,
    }
    path = directory / f"cluster-sweep-{runs}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def time_sweep(scenario: Path, extra: list[str], env: dict[str, str]) -> tuple[dict, dict[str, object], str]:
    with tempfile.TemporaryDirectory(prefix="cluster-sweep-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "bench.cli", "run", str(scenario), "--out", str(out), *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(cmd[3:])} failed (exit {proc.returncode}): {proc.stdout[-1500:]}")
        files, run_s = comparable(out)
        runs = len([n for n in files if n.endswith(".json")])
        summary = next((x for x in proc.stdout.splitlines() if x.startswith("cluster: ")), "")
        return {"wall_s": wall, "runs": runs, "run_s": run_s}, files, summary


def main() -> None:
    from cluster.ray.local_nodes import LocalRayNodes, NodeSpec

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=64, help="runs in the sweep (2 variants x runs/2 repeats)")
    ap.add_argument("--requests", type=int, default=40, help="requests a run")
    ap.add_argument("--workers", type=int, default=2, help="worker Ray nodes of one CPU each")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if args.runs < 2 or args.runs % 2 or args.requests < 1 or args.workers < 1 or args.repeats < 1:
        raise SystemExit("--runs: an even number >= 2; --requests, --workers, --repeats: >= 1")
    nodes = [NodeSpec(cpus=0)] + [NodeSpec(cpus=1) for _ in range(args.workers)]
    with tempfile.TemporaryDirectory(prefix="cluster-sweep-scenario-") as tmp:
        scenario = scenario_file(Path(tmp), args.runs, args.requests)
        t0 = time.perf_counter()
        with LocalRayNodes(nodes) as cluster:
            start_s = time.perf_counter() - t0
            env = cluster.env()
            modes = {
                "--jobs 1 (this machine, one after another)": ([], dict(os.environ)),
                f"--address (cluster) --jobs {args.workers}": (
                    ["--address", cluster.address, "--jobs", str(args.workers)],
                    env,
                ),
            }
            timings: dict[str, list[dict]] = {m: [] for m in modes}
            reference: dict[str, object] | None = None
            same, summary = True, ""
            for rep in range(args.repeats):
                for mode, (extra, mode_env) in modes.items():
                    t, files, line = time_sweep(scenario, extra, mode_env)
                    summary = line or summary
                    timings[mode].append(t)
                    if reference is None:
                        reference = files
                    elif files != reference:
                        same = False
                    print(f"rep {rep} {mode}: {t['wall_s']:.2f} s, {t['runs']} runs ({t['run_s']:.2f} s of runs)")
        leftover = cluster.leftover_pids
    text = _entry(args, timings, same, start_s, summary, leftover)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry(SECTION, text)
    if not same:
        raise SystemExit("the cluster's results differ from the sequential run's")


def _entry(args, timings: dict[str, list[dict]], same: bool, start_s: float, summary: str, leftover) -> str:
    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {args.runs} runs of {args.requests} requests: "
        f"--jobs 1 vs {args.workers} worker Ray nodes, median of {args.repeats}",
        "",
        f"{machine_line()} Tree: {tree_label()}. Command: `.venv/bin/python -m benchmarks.cluster_sweep --runs "
        f"{args.runs} --requests {args.requests} --workers {args.workers} --repeats {args.repeats} --record`. "
        f"Cluster: head (0 CPU) + {args.workers} nodes of 1 CPU on loopback aliases, started in {start_s:.0f} s "
        "(not in the times below).",
        "",
        "| command | wall s (median) | each | runs | the runs' own s, summed (median) | speed-up |",
        "|---|---:|---|---:|---:|---:|",
    ]
    base = statistics.median(t["wall_s"] for t in next(iter(timings.values())))
    for mode, ts in timings.items():
        wall = statistics.median(t["wall_s"] for t in ts)
        each = ", ".join(format(t["wall_s"], ".2f") for t in ts)
        lines.append(
            f"| {mode} | {wall:.2f} | {each} | {ts[0]['runs']} | "
            f"{statistics.median(t['run_s'] for t in ts):.2f} | {base / wall:.2f}x |"
        )
    lines += [
        "",
        f"- Every results JSON (less wall time and provenance) and step trace the same as the sequential run's: "
        f"{'yes' if same else '**NO**'}.",
        f"- The driver's report: `{summary}`." if summary else "- (no cluster line in the driver's report)",
        f"- Cluster processes left after it stopped: {len(leftover)}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
