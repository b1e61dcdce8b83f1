"""The fast paths change nothing observable (issue 15): the same scenario
with them off (`engine.fast_paths.set_enabled(False)`, as
`DISAGG_SIM_FAST_PATHS=0` does) and on gives bit-for-bit the same results —
every request's token ids, token times, finish, every step record, every
node counter (`num_allocate_slots_calls` included), shadow KV findings and
invariant errors. Only the loop's own event count and the fast-forward's
statistics may differ.

The steady-decode fast-forward (engine/steady_decode.py,
cluster/inproc/fast_forward.py) has its own tests below, on scenarios it
covers most of, and on the corners where it must step aside or stop short.
Faults (nodes killed, clients going away, random scenarios with stop
conditions): test_fast_paths_faults.py. Every test here also checks the
steady cohort the fast paths keep from step to step against one built from
scratch, at every use (fast_paths_helpers.py).
"""

from __future__ import annotations

import random

import pytest

from cluster.inproc.cluster import InProcCluster
from cluster.kv_transfer import KVTransferSettings
from cluster.spec import ClusterSpec
from engine import compiled
from engine.prompt import segment_key
from engine.records import WorkloadRequest

from .fast_paths_helpers import (  # noqa: F401  (check_the_steady_cohort: an autouse fixture)
    assert_identical,
    check_the_steady_cohort,
    random_scenario,
    run_both,
    with_prefix,
)


@pytest.mark.parametrize("seed", range(40))
def test_fast_paths_change_nothing_on_random_scenarios(seed: int) -> None:
    rng = random.Random(1000 + seed)
    cluster, workload, max_concurrency = random_scenario(rng)
    spec = ClusterSpec.model_validate(cluster)
    plain, fast = run_both(spec, workload, seed=seed, max_concurrency=max_concurrency)
    assert_identical(plain, fast)


# -- the steady-decode fast-forward on its own ---------------------------------------------
def _steady_cluster(prefill: int, shadow: bool, **engine) -> ClusterSpec:
    e = {"num_gpu_blocks": 3000, "max_num_seqs": 32, "max_num_batched_tokens": 2048, "enable_prefix_caching": False}
    e.update(engine)
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": prefill, "engine": dict(e)},
            "decode": {"count": 1, "engine": dict(e)},
            "shadow_kv": shadow,
        }
    )


def _bulk_cluster(prefill: int, shadow: bool, pp_size: int, async_scheduling: bool, **engine) -> ClusterSpec:
    """`_steady_cluster` whose decode node keeps several steps in flight:
    its decode-only steps are bulk steps (engine/bulk_step.py)."""
    e = {"num_gpu_blocks": 3000, "max_num_seqs": 32, "max_num_batched_tokens": 2048, "enable_prefix_caching": False}
    e.update(engine)
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": prefill, "engine": dict(e)},
            "decode": {"count": 1, "pp_size": pp_size, "engine": dict(e, async_scheduling=async_scheduling)},
            "shadow_kv": shadow,
        }
    )


def _poisson(n: int, rate: float, seed: int, out: tuple[int, int] = (20, 300)) -> list[WorkloadRequest]:
    rng = random.Random(seed)
    t = 0.0
    wl = []
    for i in range(n):
        t += rng.expovariate(rate)
        wl.append(WorkloadRequest(f"q{i}", t, rng.randint(8, 400), rng.randint(*out)))
    return wl


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("prefill,shadow", [(0, False), (0, True), (1, False), (1, True)])
def test_steady_decode_fast_forward_is_exact(seed: int, prefill: int, shadow: bool) -> None:
    """Scenarios where most steps are forwarded: the same results as stepping one by one."""
    rng = random.Random(seed)
    spec = _steady_cluster(prefill, shadow, block_size=rng.choice([4, 16]), max_num_seqs=rng.choice([8, 32]))
    workload = _poisson(rng.randint(20, 80), rng.choice([2.0, 10.0, 40.0]), seed)
    plain, fast = run_both(spec, workload, seed=seed)
    assert_identical(plain, fast)
    assert not fast.invariant_errors
    assert fast.extra["steps_fast_forwarded"] > 0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("prefill,shadow", [(0, False), (0, True), (1, True)])
def test_steady_decode_with_prefix_caching_is_exact(seed: int, prefill: int, shadow: bool) -> None:
    """Prefix caching on, requests sharing system prompts, a pool small
    enough to reuse cached blocks: the steady paths cache the blocks decode
    completes as `allocate_slots` does step by step (the same hashes, hits,
    evictions and free-queue order), and forward most steps."""
    rng = random.Random(seed)
    block_size = rng.choice([4, 16])
    # A pool that the run cycles through: freed cached blocks are evicted for reuse.
    spec = _steady_cluster(
        prefill, shadow, enable_prefix_caching=True, block_size=block_size, num_gpu_blocks=9600 // block_size
    )
    prefixes = [(segment_key(f"system/{k}"), rng.choice([block_size * 3, 50])) for k in range(2)]
    workload = [with_prefix(w, rng.choice(prefixes)) for w in _poisson(rng.randint(30, 60), 10.0, seed)]
    plain, fast = run_both(spec, workload, seed=seed)
    assert_identical(plain, fast)
    assert not fast.invariant_errors
    assert fast.extra["steps_fast_forwarded"] > len(fast.steps) // 3
    assert fast.node_counters["decode-0"]["prefix_cache_hits"] > 0


@pytest.mark.parametrize("seed", range(16))
def test_bulk_steps_are_exact(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode nodes that keep several steps in flight (async scheduling,
    pipeline stages) schedule their decode-only steps in bulk
    (engine/bulk_step.py), small pools included (preemptions, then bulk
    steps again): the same results as the plain path, and most steps bulk."""
    import engine.scheduler as scheduler_module

    taken = {"bulk": 0, "plain": 0}
    schedule_bulk = scheduler_module.schedule_bulk

    def counted(s, sampler):
        so = schedule_bulk(s, sampler)
        taken["plain" if so is None else "bulk"] += 1
        return so

    monkeypatch.setattr(scheduler_module, "schedule_bulk", counted)
    rng = random.Random(seed)
    block_size = rng.choice([4, 16])
    pp_size, async_scheduling = rng.choice([1, 2, 3]), seed % 4 != 3
    spec = _bulk_cluster(
        rng.choice([0, 1]),
        rng.random() < 0.5,
        pp_size=pp_size,
        async_scheduling=async_scheduling,
        num_gpu_blocks=rng.choice([1500, 5000, 48000]) // block_size,  # tokens: the smallest preempts
        max_num_seqs=rng.choice([8, 32]),
        enable_prefix_caching=rng.random() < 0.5,
        block_size=block_size,
    )
    workload = _poisson(rng.randint(20, 60), rng.choice([5.0, 20.0]), seed, out=(1, 200))
    plain, fast = run_both(spec, workload, seed=seed)
    assert_identical(plain, fast)
    assert not fast.invariant_errors
    if compiled.build_label() != "pure":
        # A compiled Scheduler calls the compiled schedule_bulk directly, not
        # the module attribute patched above (docs/compiled.md): the counts
        # below are checked on the pure build.
        return
    if async_scheduling:
        assert taken["bulk"] > taken["plain"], taken
    elif pp_size > 1:  # (a synchronous node skips a request whose output is in flight: some steps decode nobody)
        assert taken["bulk"] > taken["plain"] // 3, taken


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("preset", ["nixl", "p2pnccl"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_pd_hand_off_timeline_keeps_the_fast_paths_exact(seed: int, preset: str, async_scheduling: bool) -> None:
    """The proxy's legs and the connector's terms (cluster.kv_transfer) are
    events like any other: forwarded and bulk steps give the same results,
    TTFT breakdowns included."""
    rng = random.Random(seed)
    if async_scheduling:
        spec = _bulk_cluster(1, True, pp_size=rng.choice([1, 2]), async_scheduling=True, block_size=rng.choice([4, 16]))
    else:
        spec = _steady_cluster(1, True, block_size=rng.choice([4, 16]), max_num_seqs=rng.choice([8, 32]))
    spec.kv_transfer = KVTransferSettings(preset=preset, handshake_s=rng.choice([0.0, 0.3]))
    workload = _poisson(rng.randint(20, 60), rng.choice([2.0, 10.0, 40.0]), seed)
    plain, fast = run_both(spec, workload, seed=seed)
    assert_identical(plain, fast)
    assert not fast.invariant_errors
    assert all(r.ttft_breakdown is not None for r in fast.requests if r.token_times)


def test_fast_forward_does_most_steps_of_a_light_load() -> None:
    """Requests arrive slower than they finish: most steps are steady decode."""
    spec = _steady_cluster(0, True)
    plain, fast = run_both(spec, _poisson(40, 2.0, 11, out=(100, 300)))
    assert_identical(plain, fast)
    assert fast.extra["steps_fast_forwarded"] > len(fast.steps) // 2


def test_fast_forward_stops_when_blocks_run_out() -> None:
    """A pool that fills up during steady decode: the forward stops before
    the allocation that would fail, and the preemptions that follow are
    the same."""
    spec = _steady_cluster(0, True, num_gpu_blocks=60, block_size=4, max_num_seqs=4)
    workload = [WorkloadRequest(f"p{i}", 0.001 * i, 20, 200) for i in range(4)]
    plain, fast = run_both(spec, workload)
    assert_identical(plain, fast)
    assert fast.node_counters["decode-0"]["num_preemptions"] > 0
    assert fast.extra["steps_fast_forwarded"] > 0


def test_cancelled_hold_timers_end_no_forward() -> None:
    """A prefill node's hold timer, cancelled by the done report, stays in
    the loop's queue until its time; it runs nothing then, so a forward on
    the decode node passes over it: as many forwards with hold timers that
    come due mid-decode as with ones far past the end of the run."""
    workload = [WorkloadRequest(f"r{i}", 0.001 * i, 100, 400) for i in range(4)]
    jumps = {}
    # A free hand-off: the done report comes well within the 0.5 s hold (NIXL's 2 s handshake would not).
    free = KVTransferSettings(preset="none")
    for hold in (0.5, 1000.0):
        spec = _steady_cluster(1, False).model_copy(update={"kv_hold_timeout_s": hold, "kv_transfer": free})
        cluster = InProcCluster(spec, seed=0)
        cluster.submit(workload)
        result = cluster.run()
        assert result.node_counters["prefill-0"]["kv_hold_timeouts"] == 0
        jumps[hold] = [f.jumps for f in cluster._forwarders]
    assert jumps[0.5] == jumps[1000.0]
    plain, fast = run_both(
        _steady_cluster(1, False).model_copy(update={"kv_hold_timeout_s": 0.5, "kv_transfer": free}), workload
    )
    assert_identical(plain, fast)


def test_fast_forward_with_a_closed_loop_backlog() -> None:
    """With a backlog, the proxy's receipt of a finish starts the next request:
    the forward must stop at it (and does, exactly)."""
    spec = _steady_cluster(0, False)
    workload = _poisson(60, 50.0, 7)
    plain, fast = run_both(spec, workload, max_concurrency=5)
    assert_identical(plain, fast)
    assert fast.extra["steps_fast_forwarded"] > 0


def test_fast_forward_steps_aside_for_eos_and_async() -> None:
    """Requests that can stop on a sampled EOS, and async scheduling, are
    stepped one by one (and still agree)."""
    for cluster in (
        {"sampler": {"stop_probability": 0.02}},
        {
            "decode": {"count": 1, "engine": {"async_scheduling": True, "enable_prefix_caching": False}},
            "prefill": {"count": 0},
        },
    ):
        spec = ClusterSpec.model_validate({"prefill": {"count": 0}, "shadow_kv": True, **cluster})
        plain, fast = run_both(spec, _poisson(30, 20.0, 3))
        assert_identical(plain, fast)
        assert fast.extra["steps_fast_forwarded"] == 0


def test_records_keep_token_runs_checkable() -> None:
    """Forwarded tokens are kept as runs of output indices: the end-of-run
    check still finds a gap."""
    from cluster.invariants import check_tokens
    from engine.records import RequestRecord
    from engine.sampler import DeterministicSampler
    from engine.token_ids import TokenIds

    token_at = DeterministicSampler(0).token_at
    rec = RequestRecord("x", 0.0, 10, 6)
    ids = TokenIds([token_at("x", 10)])
    ids.add_run(token_at, "x", 10, 1, 3)
    ids.extend([token_at("x", 14), token_at("x", 15)])
    rec.output_token_ids, rec.token_times, rec.finish_reason = ids, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "length"
    assert ids == [token_at("x", 10 + i) for i in range(6)]
    assert check_tokens(rec, token_at, 2) == []
    gap = TokenIds([token_at("x", 10)])
    gap.add_run(token_at, "x", 10, 2, 5)  # index 1 missing
    rec.output_token_ids = gap
    assert any("token 1" in e for e in check_tokens(rec, token_at, 2))
