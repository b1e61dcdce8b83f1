"""Chaos soak: in-process runs back to back, each under a fresh seeded chaos
plan (node kills, KV partitions, loss bursts, slow stages; cluster/chaos.py)
on top of KV, proxy-link and stage-link loss and broken stage links (decode
nodes with two pipeline stages), for `--minutes` of wall time. Reports the
faults injected and survived, the requests lost (neither finished nor
failed) and leaked (blocks left held), and the process RSS over the soak
(flat: nothing accumulates across runs).

    .venv/bin/python -m benchmarks.chaos_soak --minutes 10

Not part of the test suite (it takes as long as it is told).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

from cluster.chaos import ChaosConfig
from cluster.inproc import InProcCluster
from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest


def rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / (1 << 20)


def soak_spec(seed: int) -> ClusterSpec:
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": 2, "engine": {"num_gpu_blocks": 400}},
            # Two pipeline stages per decode node, so the stage links carry
            # every step: lossy on odd seeds, and on every fourth seed broken
            # for good (an outage past TCP's retransmissions, issue 34).
            "decode": {"count": 3, "pp_size": 2, "engine": {"num_gpu_blocks": 400, "async_scheduling": True}},
            "links": {
                "kv": {"delay_ms": 1.0, "jitter_ms": 0.3, "loss": (seed % 5) / 10},
                "proxy": {"delay_ms": 1.0, "loss": 0.02},
                "stage": {
                    "delay_ms": 0.5,
                    "loss": 0.3 * (seed % 2),
                    "outages": [[1.0 + (seed % 3) * 0.5, 40.0]] if seed % 4 == 0 else [],
                },
            },
            "kv_pull_timeout_s": 0.2,
            "kv_pull_deadline_s": 1.0,
            "kv_hold_timeout_s": 3.0,
        }
    )


def one_run(seed: int) -> dict:
    cluster = InProcCluster(soak_spec(seed), seed=seed)
    cluster.submit([WorkloadRequest(f"s{seed}-{i:03d}", i * 0.02, 48 + (i * 7) % 80, 24) for i in range(150)])
    cluster.inject_chaos(ChaosConfig(seed=seed, end_s=3.0, kills=2, partitions=3, loss_bursts=3, slow_stages=3))
    result = cluster.run()
    return result.extra["chaos"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--json", type=Path, help="write the summary here too")
    args = parser.parse_args()
    start = time.monotonic()
    totals = {"runs": 0, "faults_injected": 0, "faults_survived": 0, "requests": 0, "failed": 0, "lost": 0, "leaked": 0}
    unsurvived: list[int] = []
    rss: list[float] = []
    seed = 0
    while time.monotonic() - start < args.minutes * 60:
        report = one_run(seed)
        totals["runs"] += 1
        totals["faults_injected"] += report["faults_injected"]
        totals["faults_survived"] += report["faults_survived"]
        totals["requests"] += report["requests"]
        totals["failed"] += report["requests_failed"]
        totals["lost"] += report["requests_lost"]
        totals["leaked"] += report["requests_leaked"]
        if not report["survived"]:
            unsurvived.append(seed)
        gc.collect()
        rss.append(rss_mib())
        seed += 1
    tenth = max(1, len(rss) // 10)
    summary = {
        **totals,
        "unsurvived_seeds": unsurvived[:20],
        "minutes": round((time.monotonic() - start) / 60, 2),
        "rss_mib_first_tenth": round(sum(rss[:tenth]) / tenth, 1),
        "rss_mib_last_tenth": round(sum(rss[-tenth:]) / tenth, 1),
        "rss_mib_max": round(max(rss), 1),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
