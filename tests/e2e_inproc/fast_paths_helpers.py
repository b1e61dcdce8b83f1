"""What the fast-path tests share (test_fast_paths.py, test_fast_paths_faults.py):
running a scenario with the fast paths off and on, the comparison of the two
results, and the random scenarios. Every test using them also checks the
steady cohort the fast paths keep from step to step against one built from
scratch, at every use (`check_the_steady_cohort`; engine/steady_cohort.py,
`CHECK`)."""

from __future__ import annotations

import dataclasses
import random

import pytest

import engine.steady_cohort as steady_cohort
from cluster.inproc import run_inproc
from cluster.inproc.cluster import InProcCluster
from cluster.spec import ClusterSpec
from engine import fast_paths
from engine.prompt import segment_key
from engine.records import WorkloadRequest

RUNTIME_ONLY = ("num_events", "steps_fast_forwarded")


@pytest.fixture(autouse=True)
def check_the_steady_cohort(monkeypatch):
    monkeypatch.setattr(steady_cohort, "CHECK", True)


def run_both(spec: ClusterSpec, workload: list[WorkloadRequest], seed: int = 0, max_concurrency: int | None = None):
    out = []
    for on in (False, True):
        previous = fast_paths.set_enabled(on)
        try:
            out.append(run_inproc(spec, workload, seed=seed, max_concurrency=max_concurrency))
        finally:
            fast_paths.set_enabled(previous)
    return out


def request_view(r) -> tuple:
    return (
        r.request_id,
        r.arrival_time,
        r.first_scheduled_time,
        r.remote_kv_wait_start,
        r.remote_kv_wait_end,
        list(r.token_times),
        list(r.output_token_ids),
        r.finish_time,
        r.finish_reason,
        r.num_preemptions,
        r.ttft_breakdown,
    )


def assert_identical(plain, fast) -> None:
    assert plain.duration == fast.duration
    assert [request_view(r) for r in plain.requests] == [request_view(r) for r in fast.requests]
    assert [s.to_dict() for s in plain.steps] == [s.to_dict() for s in fast.steps]
    assert plain.node_counters == fast.node_counters
    assert plain.violations == fast.violations
    assert plain.invariant_errors == fast.invariant_errors
    strip = lambda extra: {k: v for k, v in extra.items() if k not in RUNTIME_ONLY}  # noqa: E731
    assert strip(plain.extra) == strip(fast.extra)
    assert plain.extra["steps_fast_forwarded"] == 0


def random_scenario(rng: random.Random) -> tuple[dict, list[WorkloadRequest], int | None]:
    """A small cluster and workload drawn from the settings the fast paths
    look at: topology, async scheduling, pipeline stages, fence, prefix
    caching, shadow KV, pool size (preemptions), EOS, links, arrivals."""
    n_prefill = rng.choice([0, 0, 1, 2])
    blocks = rng.choice([48, 96, 400, 2000])
    engine = {
        "num_gpu_blocks": blocks,
        "block_size": rng.choice([4, 16]),
        "max_num_seqs": rng.choice([4, 16, 64]),
        "max_num_batched_tokens": rng.choice([256, 2048]),
        "max_model_len": rng.choice([512, 2048]),
        "enable_prefix_caching": rng.random() < 0.3,
        "policy": rng.choice(["fcfs", "fcfs", "priority"]),
    }
    decode_engine = dict(engine, async_scheduling=rng.random() < 0.25, fence=rng.choice(["auto", "auto", "on", "off"]))
    cluster = {
        "prefill": {"count": n_prefill, "engine": dict(engine, num_gpu_blocks=2000)},
        "decode": {"count": rng.choice([1, 1, 2]), "pp_size": rng.choice([1, 1, 1, 2]), "engine": decode_engine},
        "cost_model": "synthetic-8b",
        "shadow_kv": rng.random() < 0.5,
        "routing": rng.choice(["round_robin", "least_loaded"]),
        "sampler": {"stop_probability": rng.choice([0.0, 0.0, 0.01]), "ignore_eos": rng.random() < 0.2},
    }
    if rng.random() < 0.2:
        cluster["links"] = {"proxy": {"delay_ms": 0.5, "jitter_ms": 0.1}}
    elif rng.random() < 0.3:
        cluster["links"] = {"kv": {"delay_ms": 2.0}}
    n = rng.randint(5, 60)
    rate = rng.choice([5.0, 20.0, 200.0])
    t = 0.0
    workload = []
    for i in range(n):
        if rng.random() < 0.9:
            t += rng.expovariate(rate)
        workload.append(
            WorkloadRequest(
                f"r{i}",
                round(t, 6),
                rng.randint(1, 300),
                rng.randint(1, 200),
                priority=rng.randint(0, 2),
            )
        )
    max_concurrency = rng.choice([None, None, None, 4])
    # Drawn last (the draws above keep their seeds' scenarios): a roofline
    # preset has no `decode_step_time`, and the forward then builds each shape.
    cluster["cost_model"] = rng.choice(["synthetic-8b", "synthetic-8b", "unit", "llama-3.1-8b-h100"])
    if rng.random() < 0.4:
        # System prompts shared by several requests: prefix-cache hits, and
        # blocks held by two requests at once.
        prefixes = [(segment_key(f"system/{k}"), rng.choice([8, 40, 100])) for k in range(rng.randint(1, 3))]
        workload = [with_prefix(w, rng.choice(prefixes)) for w in workload]
    # The API server's streaming (engine/front_end.py `OutputStream`): off,
    # the default preset, and one slower than a step, so batches queue.
    cluster["front_end"] = rng.choice([{"preset": "off"}, {}, {"output_token_us": 3000.0}])
    return cluster, workload, max_concurrency


def with_prefix(w: WorkloadRequest, prefix: tuple[int, int]) -> WorkloadRequest:
    own = (segment_key(f"user/{w.request_id}"), w.prompt_len)
    return dataclasses.replace(w, prompt_len=prefix[1] + w.prompt_len, prompt_segments=(prefix, own))


def run_with(
    spec: ClusterSpec,
    work: list[WorkloadRequest],
    on: bool,
    setup=None,
    seed: int = 0,
    max_concurrency: int | None = None,
):
    """One run with the fast paths `on` or off; `setup(cluster)` before it runs (faults, aborts)."""
    previous = fast_paths.set_enabled(on)
    try:
        cluster = InProcCluster(spec, seed=seed)
        cluster.submit(work, max_concurrency)
        if setup is not None:
            setup(cluster)
        return cluster.run()
    finally:
        fast_paths.set_enabled(previous)
