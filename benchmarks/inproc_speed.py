"""Speed of the in-process runtime: simulated decode tokens and requests per
wall-clock second, and peak memory, on a workload of >= 10,000 requests.

    .venv/bin/python -m benchmarks.inproc_speed [--requests 10000] [--record]

`--record` adds the figures to benchmarks/RESULTS.md (newest first).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import resource
import time
from datetime import UTC, datetime

from bench.workloads import generate_workload, parse_workload_spec
from cluster.inproc import run_inproc
from cluster.spec import ClusterSpec


def spec(shadow: bool, prefix_caching: bool = True) -> ClusterSpec:
    apc = {"enable_prefix_caching": prefix_caching}
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": 2, "engine": {"num_gpu_blocks": 8000, "max_num_seqs": 256, **apc}},
            "decode": {
                "count": 2,
                "engine": {"num_gpu_blocks": 8000, "max_num_seqs": 256, "async_scheduling": True, **apc},
            },
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


def measure(n: int, shadow: bool, prefix_caching: bool = True) -> dict:
    wl = workload(n)
    t0 = time.perf_counter()
    result = run_inproc(spec(shadow, prefix_caching), wl, seed=0)
    wall = time.perf_counter() - t0
    decode_tokens = sum(len(r.output_token_ids) for r in result.requests)
    assert not result.invariant_errors, result.invariant_errors[:3]
    return {
        "requests": n,
        "shadow_kv": shadow,
        "prefix_caching": prefix_caching,
        "wall_s": wall,
        "simulated_s": result.duration,
        "decode_tokens": decode_tokens,
        "decode_tokens_per_wall_s": decode_tokens / wall,
        "requests_per_wall_s": n / wall,
        "events": result.extra["num_events"],
        # Peak resident memory of this (fresh) process: the workload, the run and its records.
        "max_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure_in_child(n: int, shadow: bool, prefix_caching: bool = True) -> dict:
    """Each configuration in a fresh process, so peak memory is its own."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(measure, (n, shadow, prefix_caching))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    # Prefix caching off and on, interleaved, for its cost (target: on <= 1.3x off).
    rows = [
        measure_in_child(args.requests, shadow=shadow, prefix_caching=apc)
        for shadow in (False, True)
        for apc in (False, True)
    ]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {args.requests} requests, 2 prefill + 2 decode nodes",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}; ShareGPT-like lengths, "
        "Poisson 40 req/s, synthetic-8b cost model.",
        "",
        f"Load average at the end: {load} (2 cores, shared).",
        "",
        "| shadow KV | prefix caching | wall s | simulated s | decode tokens | decode tok / wall s | req / wall s "
        "| events | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {'on' if r['shadow_kv'] else 'off'} | {'on' if r['prefix_caching'] else 'off'} | "
            f"{r['wall_s']:.1f} | {r['simulated_s']:.1f} | "
            f"{r['decode_tokens']} | {r['decode_tokens_per_wall_s']:.0f} | {r['requests_per_wall_s']:.0f} | "
            f"{r['events']} | {r['max_rss_MB']:.0f} |"
        )
    lines.append("")
    for off, on in zip(rows[::2], rows[1::2]):
        lines.append(
            f"Prefix caching on / off, shadow KV {'on' if off['shadow_kv'] else 'off'}: wall "
            f"{on['wall_s'] / off['wall_s']:.2f}x (target <= 1.3x)."
        )
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry("## In-process runtime speed (benchmarks/inproc_speed.py)", text)


if __name__ == "__main__":
    main()
