"""Calibrates `bench/memory_estimate.py`: peak RSS of real `disagg-sim run`s
of the `serve` scenario (1P+1D) at several request counts and output
lengths, each in a fresh process (its own peak, from `wait4`), against the
estimate; and the least-squares line through them (the estimate's
constants come from it).

    .venv/bin/python -m benchmarks.memory_estimate --record

Not part of the test suite (a few minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.memory_estimate import BASE_MIB, PER_OUTPUT_TOKEN_KIB, PER_REQUEST_KIB, RunSize
from benchmarks.results_md import record_entry

POINTS = [
    (500, 32),
    (4000, 32),
    (500, 256),
    (2000, 256),
    (2000, 128),
    (8000, 64),
    (16000, 32),
    (10000, 128),
    (6000, 256),
]


def peak_rss_mib(requests: int, output_len: int) -> tuple[float, float]:
    out = tempfile.mkdtemp(prefix="memest-")
    cmd = [".venv/bin/disagg-sim", "run", "serve", "--out", out, "--set", f"workload.num_requests={requests}"]
    cmd += ["--set", f"workload.output_len={output_len}", "--set", "workload.arrival.rate=200"]
    began = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed")
    return usage.ru_maxrss / 1024, time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--measured", type=Path, help="take the measurements from this --json file (no runs)")
    args = parser.parse_args()
    if args.measured:
        measured = [tuple(m) for m in json.loads(args.measured.read_text())]
    else:
        measured = [(n, out, *peak_rss_mib(n, out)) for n, out in POINTS]
        if args.json:
            args.json.write_text(json.dumps(measured) + "\n")
    rows = []
    for n, out, rss, seconds in measured:
        est = RunSize(n, out).mib
        rows.append((n, out, rss, est, seconds))
        print(f"{n:>6} requests x {out:>4} tokens: peak {rss:7.1f} MiB, estimate {est:7.1f} MiB ({seconds:.0f} s)")
    a = np.array([[1.0, n, n * out] for n, out, *_ in rows])
    b = np.array([rss for _, _, rss, *_ in rows])
    (base, per_req, per_tok), *_ = np.linalg.lstsq(a, b, rcond=None)
    fit = f"base {base:.1f} MiB, {per_req * 1024:.2f} KiB a request, {per_tok * 1024:.3f} KiB an output token"
    print("least squares:", fit)
    if args.record:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        lines = [
            f"### {stamp} — the `serve` scenario (1P+1D), {len(rows)} sizes",
            "",
            f"Estimate in use: base {BASE_MIB:g} MiB, {PER_REQUEST_KIB:g} KiB a request, "
            f"{PER_OUTPUT_TOKEN_KIB:g} KiB an output token. Least squares through these points: {fit}.",
            "",
            "| requests | output tokens | peak RSS (MiB) | estimate (MiB) | estimate / peak | run (s) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [f"| {n:,} | {o} | {r:.0f} | {e:.0f} | {e / r:.2f} | {s:.0f} |" for n, o, r, e, s in rows]
        intro = (
            "Peak RSS of `disagg-sim run serve` at several sizes, each in a fresh process, against\n"
            "`bench/memory_estimate.py` (`--max-memory`). Command: `.venv/bin/python -m benchmarks.memory_estimate`."
        )
        record_entry("## Memory estimate (benchmarks/memory_estimate.py)", "\n".join(lines) + "\n", intro)


if __name__ == "__main__":
    main()
