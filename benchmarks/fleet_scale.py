"""A fleet in one process (issue 36, docs/fleet.md): 32 prefill and 96
decode nodes serving a million requests on the in-process runtime, with
the records streamed (`InProcCluster(stream=...)`, bench/metrics_stream.py)
and no step records kept. Records the run's wall time, peak RSS (target:
<= 4 GB) and simulated steps per wall second.

Workload: prompts uniform in [64, 256] tokens, outputs uniform in [16, 128],
Poisson arrivals at `--rate` requests/s (modelled), seed 0; nodes with the
`llama-3.1-8b-h100` cost model (`--cost-model`), 7,424 blocks of 16 tokens, `max_num_seqs` 256,
shadow KV off (the block payload check; off as in benchmarks/inproc_speed.py),
the API server model off (one API server in front of 128 nodes would bound the run);
routing least-loaded in both pools unless `--routing` says.

    .venv/bin/python -m benchmarks.fleet_scale --requests 100000 [--record]
    .venv/bin/python -m benchmarks.fleet_scale --requests 1000000 --record

Each run is one fresh child process, so its peak RSS is its own
(`ru_maxrss`); the parent also samples the child's RSS every few seconds
(`--rss-log`) to show that it stays flat as requests finish.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent


def cluster_dict(prefill: int, decode: int, routing: str, cost_model: str = "llama-3.1-8b-h100") -> dict:
    engine = {"num_gpu_blocks": 7424, "block_size": 16, "max_num_seqs": 256, "max_num_batched_tokens": 4096}
    return {
        "prefill": {"count": prefill, "engine": engine},
        "decode": {"count": decode, "engine": engine},
        "routing": routing,
        "shadow_kv": False,
        # One API server model queues every request of the fleet in turn (engine/front_end.py):
        # at thousands of requests/s it, not the nodes, would bound the run. A fleet has many.
        "front_end": {"preset": "off"},
        "cost_model": cost_model,
    }


def workload_dict(requests: int, rate: float) -> dict:
    return {
        "num_requests": requests,
        "prompt_len": {"kind": "uniform", "low": 64, "high": 256},
        "output_len": {"kind": "uniform", "low": 16, "high": 128},
        "arrival": {"kind": "poisson", "rate": rate},
    }


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    from bench.metrics_stream import StreamedMetrics
    from bench.workloads import generate_workload, parse_workload_spec
    from cluster.inproc import InProcCluster
    from cluster.inproc.collector import collector_paused
    from cluster.spec import ClusterSpec

    spec = ClusterSpec.model_validate(cluster_dict(args.prefill, args.decode, args.routing, args.cost_model))
    t0 = time.perf_counter()
    workload = generate_workload(parse_workload_spec(workload_dict(args.requests, args.rate)))
    metrics = StreamedMetrics(t0=workload[0].arrival_time)
    every = max(1, args.requests // 20)

    def add(batch: list) -> None:
        before = metrics.num_requests
        metrics.add(batch)
        if before // every != metrics.num_requests // every:  # progress, on stderr
            cpu = time.process_time()
            print(f"  {metrics.num_requests:,} requests done, CPU {cpu:.0f} s", file=sys.stderr, flush=True)

    with collector_paused():
        cluster = InProcCluster(spec, seed=0, stream=add, keep_steps=False)
        cluster.submit(workload)
    del workload
    t1 = time.perf_counter()
    result = cluster.run()
    t2 = time.perf_counter()
    m = metrics.to_dict(result.duration)
    out = {
        "setup_s": t1 - t0,
        "run_s": t2 - t1,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cpu_s": time.process_time(),
        "num_steps": result.extra["num_steps"],
        "num_events": result.extra["num_events"],
        "simulated_s": result.duration,
        "invariant_errors": len(result.invariant_errors),
        "first_errors": result.invariant_errors[:3],
        "metrics": {
            k: m[k]
            for k in (
                "num_requests",
                "completed",
                "failed",
                "total_output_tokens",
                "request_throughput",
                "median_ttft_ms",
                "p99_ttft_ms",
                "median_tpot_ms",
                "p99_tpot_ms",
                "p99_itl_ms",
            )
        },
    }
    print("RESULT " + json.dumps(out))


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def measure(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(HERE), "--child", "--requests", str(args.requests), "--rate", str(args.rate)]
    cmd += ["--prefill", str(args.prefill), "--decode", str(args.decode), "--routing", args.routing]
    cmd += ["--cost-model", args.cost_model]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    samples: list[tuple[float, float]] = []
    while proc.poll() is None:
        samples.append((time.perf_counter() - start, rss_mb(proc.pid)))
        if args.rss_log:
            print(f"  {samples[-1][0]:7.0f} s  RSS {samples[-1][1]:7.0f} MB", file=sys.stderr, flush=True)
        time.sleep(args.sample_s)
    stdout = proc.stdout.read() if proc.stdout else ""
    wall = time.perf_counter() - start
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the fleet run failed (exit {proc.returncode})")
    out = json.loads(lines[-1][len("RESULT ") :])
    out["wall_s"] = wall
    out["rss_samples"] = samples
    return out


def entry(args: argparse.Namespace, r: dict) -> str:
    from benchmarks.tree_state import machine_line, tree_label

    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    m = r["metrics"]
    steps_per_s = r["num_steps"] / r["run_s"]
    samples = r["rss_samples"]
    quarter = [samples[int(i * (len(samples) - 1) / 4)][1] for i in range(5)] if samples else []
    lines = [
        f"### {now} — {args.prefill}P{args.decode}D, {args.requests:,} requests at {args.rate:g}/s",
        "",
        f"{machine_line()} Tree: {tree_label()}. Command: `.venv/bin/python -m benchmarks.fleet_scale "
        f"--requests {args.requests} --rate {args.rate:g} --routing {args.routing} --cost-model {args.cost_model} "
        "--record`.",
        "",
        "| wall s (process) | CPU s | setup s | run s | peak RSS MB | simulated s | steps | steps / wall s "
        "| steps / CPU s | events |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['setup_s']:.0f} | {r['run_s']:.0f} | {r['peak_rss_mb']:.0f} | "
        f"{r['simulated_s']:.1f} | {r['num_steps']:,} | {steps_per_s:,.0f} | {r['num_steps'] / r['cpu_s']:,.0f} | "
        f"{r['num_events']:,} |",
        "",
        f"- Requests: {m['num_requests']:,}, completed {m['completed']:,}, failed {m['failed']:,}; "
        f"{m['total_output_tokens']:,} output tokens; invariant errors: {r['invariant_errors']}.",
        f"- TTFT median / p99 {m['median_ttft_ms']:.1f} / {m['p99_ttft_ms']:.1f} ms; TPOT median / p99 "
        f"{m['median_tpot_ms']:.2f} / {m['p99_tpot_ms']:.2f} ms; ITL p99 {m['p99_itl_ms']:.2f} ms.",
    ]
    if quarter:
        lines.append(
            "- RSS at 0, 1/4, 1/2, 3/4 and the end of the process (MB): " + ", ".join(f"{q:.0f}" for q in quarter)
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=4000.0)
    p.add_argument("--prefill", type=int, default=32)
    p.add_argument("--decode", type=int, default=96)
    p.add_argument("--routing", default="least_loaded")
    p.add_argument("--cost-model", default="llama-3.1-8b-h100")
    p.add_argument("--record", action="store_true")
    p.add_argument("--rss-log", action="store_true")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--child", action="store_true")
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    r = measure(args)
    text = entry(args, r)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry(
            "## A fleet in one process (benchmarks/fleet_scale.py)",
            text,
            "32 prefill + 96 decode nodes in-process, records streamed (docs/fleet.md). Peak RSS target: 4 GB.",
        )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
