"""A long fuzz campaign for the in-process fast paths (docs/fast-paths.md):
the random scenarios of tests/e2e_inproc/test_fast_paths.py ("random") and
test_fast_paths_faults.py ("faults"), and larger runs most of whose steps
are forwarded ("steady": up to 150 requests, prefix caching, shadow KV, a
prefill node, block size and pool at random) and the same on decode nodes
with several steps in flight, most of whose steps are bulk steps ("bulk":
async scheduling, pipeline stages; engine/bulk_step.py), on many more seeds than the
test suite runs, each with the fast paths off and on and the results
compared bit for bit, with the steady cohort checked against one built from
scratch at every use.

    .venv/bin/python -m tools.fuzz_fast_paths [--seconds 600] [--first-seed 20000]

Prints each failing seed (rerun it alone with `--first-seed S --seeds 1`)
and exits 1 if any failed. Runs in one process, so it also shows memory
staying flat across thousands of runs (cluster/inproc/collector.py).
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
import traceback

import engine.steady_cohort as steady_cohort
from cluster.kv_transfer import KVTransferSettings
from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest
from tests.e2e_inproc.fast_paths_helpers import assert_identical, random_scenario, run_both
from tests.e2e_inproc.test_fast_paths import _bulk_cluster, _poisson, _steady_cluster
from tests.e2e_inproc.test_fast_paths_faults import _scenario_with_faults, run_with

KINDS = ("random", "faults", "steady", "bulk")


def steady_scenario(rng: random.Random) -> tuple[ClusterSpec, list[WorkloadRequest]]:
    """A synchronous v1 cluster in steady decode most of the time, with Poisson
    arrivals: test_fast_paths.py's steady scenario, with more of it drawn."""
    spec = _steady_cluster(
        rng.choice([0, 1]),
        rng.random() < 0.5,
        num_gpu_blocks=rng.choice([300, 800, 3000]),
        max_num_seqs=rng.choice([8, 32, 128]),
        max_num_batched_tokens=rng.choice([512, 2048]),
        enable_prefix_caching=rng.random() < 0.5,
        block_size=rng.choice([4, 8, 16]),
    )
    workload = _poisson(rng.randint(30, 150), rng.choice([2.0, 10.0, 40.0]), rng.randrange(2**31), out=(1, 400))
    _hand_off(spec, rng)
    return spec, workload


def bulk_scenario(rng: random.Random) -> tuple[ClusterSpec, list[WorkloadRequest]]:
    """The steady scenario on decode nodes that keep several steps in flight
    (async scheduling, pipeline stages): most of their steps are bulk steps
    (engine/bulk_step.py), with preemptions when the pool is small."""
    block_size = rng.choice([4, 8, 16])
    spec = _bulk_cluster(
        rng.choice([0, 1]),
        rng.random() < 0.5,
        pp_size=rng.choice([1, 2, 3]),
        async_scheduling=rng.random() < 0.7,
        num_gpu_blocks=rng.choice([1500, 3000, 12000, 48000]) // block_size,  # tokens: the smaller preempt
        max_num_seqs=rng.choice([8, 32, 128]),
        max_num_batched_tokens=rng.choice([512, 2048]),
        enable_prefix_caching=rng.random() < 0.5,
        block_size=block_size,
    )
    workload = _poisson(rng.randint(30, 150), rng.choice([2.0, 10.0, 40.0]), rng.randrange(2**31), out=(1, 400))
    _hand_off(spec, rng)
    return spec, workload


def _hand_off(spec: ClusterSpec, rng: random.Random) -> None:
    """A P/D hand-off preset at random (drawn last: the draws before keep their seeds' scenarios)."""
    spec.kv_transfer = KVTransferSettings(preset=rng.choice(["none", "nixl", "mooncake", "p2pnccl"]))


def check_seed(seed: int, kind: str) -> None:
    """One scenario of `kind` (`KINDS`) both ways; raises if they differ."""
    if kind in ("steady", "bulk"):
        spec, workload = (steady_scenario if kind == "steady" else bulk_scenario)(random.Random(seed))
        assert_identical(*run_both(spec, workload, seed=seed))
    elif kind == "random":
        cluster, workload, max_concurrency = random_scenario(random.Random(seed))
        spec = ClusterSpec.model_validate(cluster)
        assert_identical(*run_both(spec, workload, seed=seed, max_concurrency=max_concurrency))
    else:
        spec, work, max_concurrency, setup = _scenario_with_faults(random.Random(seed))
        results = [run_with(spec, work, on, setup, seed=seed, max_concurrency=max_concurrency) for on in (False, True)]
        assert_identical(*results)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0, help="stop starting new seeds after this long")
    ap.add_argument("--first-seed", type=int, default=20_000, help="the tests use seeds below 1,100")
    ap.add_argument("--seeds", type=int, default=None, help="at most this many seeds")
    args = ap.parse_args()
    if args.seconds <= 0 or (args.seeds is not None and args.seeds < 1):
        ap.error("--seconds must be > 0 and --seeds at least 1")
    steady_cohort.CHECK = True
    deadline = time.monotonic() + args.seconds
    seed, failures, done = args.first_seed, [], 0
    while time.monotonic() < deadline and (args.seeds is None or done < args.seeds):
        for kind in KINDS:
            try:
                check_seed(seed, kind)
            except Exception:  # a difference (AssertionError) or a crash: both are findings
                failures.append((seed, kind))
                print(f"FAIL seed {seed} ({kind}):", file=sys.stderr)
                traceback.print_exc(limit=4)
        seed, done = seed + 1, done + 1
        if done % 200 == 0:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{done} seeds, {len(failures)} failing, peak RSS {rss:.0f} MB", flush=True)
    checked = f"{done} checked both ways ({len(KINDS) * done} scenarios)"
    print(f"seeds {args.first_seed}..{seed - 1}: {checked}, {len(failures)} failing")
    for s, kind in failures:
        print(f"  seed {s} ({kind})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
