"""Control-plane overhead per decode step in the Ray cluster.

    .venv/bin/python -m benchmarks.ray_overhead            # prints, appends to RESULTS.md
    .venv/bin/python -m benchmarks.ray_overhead --no-record --repeats 1

One decode node (no prefill node, so no KV traffic) with its pipeline stage
actors on a local loopback Ray cluster serves a batch of requests that all
arrive at t=0: every step is a decode step of the same batch. The
in-process runtime runs the same spec and workload on its virtual clock —
the engine is deterministic, so it schedules exactly the same steps — and
gives the modelled makespan, i.e. what the steps would take with a
control plane that costs nothing. Then

    overhead per decode step = (wall makespan - time_scale x modelled makespan)
                               / number of decode steps

where the wall makespan runs from the first step's submission to the last
step's completion at the decode node. It covers everything the Ray runtime
adds per step: scheduling and output processing in the node, the batch's
trips node -> stage(s) -> node (framed TCP), timer lateness (~0.2 ms per
sleep, see `RunClock.sleep_until`), and output delivery to the proxy. Steps that
schedule no tokens (a synchronous pipeline runs one between every two
decode steps) are not counted as decode steps, but their cost is included.

Target: <= 2 ms at pp_size 1 and 2, with synchronous scheduling (pp_size
batches in flight) and async scheduling (pp_size + 1). Also shown: the
median latency overhead of one step (completion - submission - its scaled
duration; with several batches in flight it includes queueing behind the
other batches, by design of the pipeline) and the node's CPU per step.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
from datetime import UTC, datetime
from pathlib import Path

from cluster.inproc import run_inproc
from cluster.ray.cluster import RayClusterHandle
from cluster.ray.runtime import run_ray
from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
TARGET_MS = 2.0

# (pp_size, async_scheduling)
CONFIGS = [(1, False), (2, False), (1, True), (2, True)]


def make_spec(pp: int, async_scheduling: bool, time_scale: float) -> ClusterSpec:
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": 0},
            "decode": {
                "count": 1,
                "pp_size": pp,
                "engine": {"num_gpu_blocks": 4000, "async_scheduling": async_scheduling},
            },
            "time_scale": time_scale,
        }
    )


def measure(handle, pp: int, async_scheduling: bool, batch: int, tokens: int, time_scale: float) -> dict:
    spec = make_spec(pp, async_scheduling, time_scale)
    workload = [WorkloadRequest(f"r{i}", 0.0, 32, tokens) for i in range(batch)]
    model = run_inproc(spec, workload, seed=0)
    run = run_ray(spec, workload, seed=0, handle=handle, timeout_s=300, keep_step_timings=True)
    if run.invariant_errors:
        raise RuntimeError(f"pp={pp}: the run broke invariants: {run.invariant_errors[:3]}")
    timings = run.extra["step_timings"]["decode-0"]  # (step, submitted, completed, modelled_s, wall_s)
    decode_steps = sum(1 for t in timings if t[3] > 0)
    model_decode_steps = sum(1 for s in model.steps if s.num_scheduled_tokens > 0)
    if decode_steps != model_decode_steps:
        raise RuntimeError(f"pp={pp}: {decode_steps} decode steps on Ray, {model_decode_steps} in-process")
    wall_span = timings[-1][2] - timings[0][1]
    model_span = model.duration * time_scale
    latency = sorted(t[2] - t[1] - t[4] for t in timings if t[3] > 0)
    return {
        "decode_steps": decode_steps,
        "all_steps": len(timings),
        "wall_span_s": wall_span,
        "model_span_s": model_span,
        "overhead_ms": (wall_span - model_span) / decode_steps * 1000,
        "latency_overhead_ms": statistics.median(latency) * 1000,
        "node_cpu_ms_per_step": run.extra["cpu_s"]["decode-0"] / len(timings) * 1000,
    }


def _runs(runs: list[dict]) -> str:
    return ", ".join(f"{r['overhead_ms']:.2f}" for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="requests decoded together")
    parser.add_argument("--tokens", type=int, default=200, help="output tokens per request")
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    rows = []
    with RayClusterHandle() as handle:
        for pp, async_scheduling in CONFIGS:
            runs = [
                measure(handle, pp, async_scheduling, args.batch, args.tokens, args.time_scale)
                for _ in range(args.repeats)
            ]
            overhead = statistics.median(r["overhead_ms"] for r in runs)
            rows.append((pp, async_scheduling, runs, overhead))
            print(
                f"pp={pp} async={async_scheduling}: overhead/decode step {overhead:.2f} ms (runs: {_runs(runs)})",
                flush=True,
            )
    load = os.getloadavg()[0]
    first = rows[0][2][0]
    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {args.batch} requests x {args.tokens} tokens, "
        f"time_scale {args.time_scale}, median of {args.repeats}",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
        f"{load:.1f} at the end; local Ray cluster on 127.0.0.1; one decode node actor + pp_size stage actors "
        "+ proxy actor. Modelled decode step ≈ "
        f"{first['model_span_s'] / first['all_steps'] * 1000 / args.time_scale:.1f} ms "
        f"(≈ {first['model_span_s'] / first['all_steps'] * 1000:.2f} ms wall after time_scale).",
        "",
        "| pp_size | scheduling (batches in flight) | decode steps | overhead / decode step (ms, median) | runs (ms) "
        "| step latency overhead (ms, median) | node CPU / step (ms) |",
        "|---:|---|---:|---:|---|---:|---:|",
    ]
    for pp, async_scheduling, runs, overhead in rows:
        mark = "" if overhead <= TARGET_MS else " (over target)"
        lines.append(
            f"| {pp} | {'async' if async_scheduling else 'sync'} ({pp + async_scheduling}) | "
            f"{runs[0]['decode_steps']} | "
            f"**{overhead:.2f}**{mark} | {_runs(runs)} | "
            f"{statistics.median(r['latency_overhead_ms'] for r in runs):.2f} | "
            f"{statistics.median(r['node_cpu_ms_per_step'] for r in runs):.2f} |"
        )
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        from benchmarks.results_md import record_entry

        record_entry(
            "## Ray control-plane overhead per decode step (benchmarks/ray_overhead.py)",
            text,
            intro=f"Target: <= {TARGET_MS:.0f} ms per decode step at pp_size 1 and 2.",
        )


if __name__ == "__main__":
    main()
