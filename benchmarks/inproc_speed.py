"""Speed of the in-process runtime: simulated decode tokens and requests per
wall-clock second, and peak memory, on a workload of >= 10,000 requests.

    .venv/bin/python -m benchmarks.inproc_speed [--requests 10000] [--record]

`--record` appends the figures to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

from bench.workloads import generate_workload, parse_workload_spec
from cluster.inproc_cluster import run_inproc
from cluster.spec import ClusterSpec


def spec(shadow: bool) -> ClusterSpec:
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": 2, "engine": {"num_gpu_blocks": 8000, "max_num_seqs": 256}},
            "decode": {"count": 2, "engine": {"num_gpu_blocks": 8000, "max_num_seqs": 256, "async_scheduling": True}},
            "links": {"kv": {"delay_ms": 1.0}},
            "cost_model": "synthetic-8b",
            "shadow_kv": shadow,
            "routing": "least_loaded",
        }
    )


def workload(n: int):
    return generate_workload(
        parse_workload_spec(
            {
                "num_requests": n,
                "prompt_len": {"kind": "sharegpt_like", "part": "prompt"},
                "output_len": {"kind": "sharegpt_like", "part": "output"},
                "arrival": {"kind": "poisson", "rate": 40.0},
            }
        ),
        seed=0,
    )


def measure(n: int, shadow: bool, trace_memory: bool) -> dict:
    wl = workload(n)
    if trace_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    result = run_inproc(spec(shadow), wl, seed=0)
    wall = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] if trace_memory else None
    if trace_memory:
        tracemalloc.stop()
    decode_tokens = sum(len(r.output_token_ids) for r in result.requests)
    assert not result.invariant_errors, result.invariant_errors[:3]
    return {
        "requests": n,
        "shadow_kv": shadow,
        "wall_s": wall,
        "simulated_s": result.duration,
        "decode_tokens": decode_tokens,
        "decode_tokens_per_wall_s": decode_tokens / wall,
        "requests_per_wall_s": n / wall,
        "events": result.extra["num_events"],
        "peak_traced_MB": None if peak is None else peak / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    rows = [measure(args.requests, shadow=False, trace_memory=False), measure(args.requests, shadow=True, trace_memory=False)]
    mem = measure(args.requests, shadow=True, trace_memory=True)
    maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines = [
        f"### {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC — {args.requests} requests, 2 prefill + 2 decode nodes",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}; ShareGPT-like lengths, Poisson 40 req/s, synthetic-8b cost model.",
        "",
        "| shadow KV | wall s | simulated s | decode tokens | decode tok / wall s | req / wall s | events |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {'on' if r['shadow_kv'] else 'off'} | {r['wall_s']:.1f} | {r['simulated_s']:.1f} | {r['decode_tokens']} | "
            f"{r['decode_tokens_per_wall_s']:.0f} | {r['requests_per_wall_s']:.0f} | {r['events']} |"
        )
    lines += ["", f"Peak Python heap (tracemalloc, shadow on): {mem['peak_traced_MB']:.0f} MB; process max RSS {maxrss_mb:.0f} MB.", ""]
    text = "\n".join(lines)
    print(text)
    if args.record:
        path = Path(__file__).parent / "RESULTS.md"
        with path.open("a") as f:
            f.write("\n## In-process runtime speed (benchmarks/inproc_speed.py)\n\n" + text + "\n")


if __name__ == "__main__":
    main()
