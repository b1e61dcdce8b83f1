"""A sweep with its runs in worker processes: `disagg-sim run SCENARIO
--jobs J` end to end, for each J given, interleaved (J1, J2, J1, J2, ...),
from the command to the last file written, and the results compared: every
results JSON (less its wall times and provenance) and step trace must be the
same whatever J.

    .venv/bin/python -m benchmarks.sweep_jobs [--scenario delay-sweep] [--jobs 1,2] [--repeats 3] [--record]
    .venv/bin/python -m benchmarks.sweep_jobs --w1-requests 2000 [--w1-runs 4] ...

The default scenario, delay-sweep, is 8 variants x 2 repeats of 80 requests
on 1 prefill + 1 decode node with async scheduling (so every step is
simulated one by one: the fast paths need synchronous scheduling).
`--w1-requests N` sweeps issue 15's W1 instead (benchmarks/cli_speed.py's
scenario: one aggregated node, prefix caching on), N requests a run,
`--w1-runs` repeats of it: fewer, larger runs, whose results and step traces
take longer to build and write. Each
command is a fresh `python -m bench.cli run` process writing into a new
temporary directory. `--record` adds the figures to benchmarks/RESULTS.md.
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

from benchmarks.tree_state import machine_line, tree_label

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Sweeps in worker processes (benchmarks/sweep_jobs.py)"


def comparable(out: Path) -> tuple[dict[str, object], float]:
    """Every results JSON (less what differs by design: its wall time and
    provenance) and step trace in `out`, by file name; and the runs' own
    wall seconds, summed."""
    files: dict[str, object] = {}
    run_s = 0.0
    for path in sorted(out.glob("*.json")):
        result = json.loads(path.read_text())
        run_s += result["extra"].pop("wall_seconds")
        result.pop("provenance", None)
        files[path.name] = result
    for path in sorted(out.glob("*.steps.jsonl")):
        files[path.name] = path.read_text()
    return files, run_s


def w1_scenario_file(directory: Path, requests: int, runs: int) -> str:
    from benchmarks.cli_speed import scenario

    data = {**scenario(requests), "name": f"w1-{requests}x{runs}", "repeats": runs}
    path = directory / f"w1-{requests}x{runs}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def time_sweep(scenario: str, jobs: int) -> tuple[dict, dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="sweep-jobs-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "bench.cli", "run", scenario, "--jobs", str(jobs), "--out", str(out)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 1):  # 1: a threshold failed, which is the scenario's business
            raise RuntimeError(f"disagg-sim run --jobs {jobs} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        files, run_s = comparable(out)
        runs = [f for name, f in files.items() if name.endswith(".json")]
        return {"wall_s": wall, "runs": len(runs), "run_s": run_s}, files


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="delay-sweep")
    ap.add_argument("--w1-requests", type=int, default=None, help="sweep W1 with this many requests a run instead")
    ap.add_argument("--w1-runs", type=int, default=4, help="repeats of the W1 scenario (with --w1-requests)")
    ap.add_argument("--jobs", default="1,2", help="comma-separated values of --jobs to time")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    try:
        jobs = [int(j) for j in args.jobs.split(",")]
    except ValueError:
        raise SystemExit(f"--jobs {args.jobs!r}: allowed: comma-separated integers >= 1, e.g. 1,2") from None
    if not jobs or min(jobs) < 1 or args.repeats < 1:
        raise SystemExit("--jobs values and --repeats must be >= 1")
    if args.w1_requests is not None and (args.w1_requests < 1 or args.w1_runs < 1):
        raise SystemExit("--w1-requests and --w1-runs must be >= 1")
    with tempfile.TemporaryDirectory(prefix="sweep-jobs-scenario-") as tmp:
        scenario = args.scenario
        if args.w1_requests is not None:
            scenario = w1_scenario_file(Path(tmp), args.w1_requests, args.w1_runs)
        timings, same = _time_all(scenario, jobs, args.repeats)
    text = _entry(args, jobs, timings, same)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry(SECTION, text)
    if not same:
        raise SystemExit("the results differ between values of --jobs")


def _time_all(scenario: str, jobs: list[int], repeats: int) -> tuple[dict[int, list[dict]], bool]:
    """Each --jobs value `repeats` times, interleaved; and whether the results were the same throughout."""
    timings: dict[int, list[dict]] = {j: [] for j in jobs}
    reference: dict[str, object] | None = None
    same = True
    for rep in range(repeats):
        for j in jobs:
            t, files = time_sweep(scenario, j)
            timings[j].append(t)
            if reference is None:
                reference = files
            elif files != reference:
                same = False
            print(
                f"rep {rep} --jobs {j}: {t['wall_s']:.2f} s, {t['runs']} runs ({t['run_s']:.2f} s of runs)", flush=True
            )
    return timings, same


def _entry(args, jobs: list[int], timings: dict[int, list[dict]], same: bool) -> str:
    w1 = args.w1_requests is not None
    name = f"W1, {args.w1_requests} requests x {args.w1_runs} runs" if w1 else args.scenario
    what = f"--w1-requests {args.w1_requests} --w1-runs {args.w1_runs}" if w1 else f"--scenario {args.scenario}"
    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — `disagg-sim run` of {name} with --jobs "
        f"{', '.join(map(str, jobs))}, median of {args.repeats}",
        "",
        f"{machine_line()} Tree: {tree_label()}. Command: `.venv/bin/python -m benchmarks.sweep_jobs "
        f"{what} --jobs {args.jobs} --repeats {args.repeats} --record`.",
        "",
        "| --jobs | command wall s (median) | each | runs | the runs' own s, summed (median) | speed-up |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    base = statistics.median(t["wall_s"] for t in timings[jobs[0]])
    for j in jobs:
        ts = timings[j]
        wall = statistics.median(t["wall_s"] for t in ts)
        each = ", ".join(format(t["wall_s"], ".2f") for t in ts)
        lines.append(
            f"| {j} | {wall:.2f} | {each} | {ts[0]['runs']} | "
            f"{statistics.median(t['run_s'] for t in ts):.2f} | {base / wall:.2f}x |"
        )
    lines += [
        "",
        f"- Results JSON (less wall times and provenance) and step traces the same for every --jobs: "
        f"{'yes' if same else '**NO**'}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
