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
Every test here also checks the steady cohort the fast paths keep from step
to step against one built from scratch, at every use
(engine/steady_cohort.py, `CHECK`).
"""

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
def _check_the_steady_cohort(monkeypatch):
    monkeypatch.setattr(steady_cohort, "CHECK", True)


def _both(spec: ClusterSpec, workload: list[WorkloadRequest], seed: int = 0, max_concurrency: int | None = None):
    out = []
    for on in (False, True):
        previous = fast_paths.set_enabled(on)
        try:
            out.append(run_inproc(spec, workload, seed=seed, max_concurrency=max_concurrency))
        finally:
            fast_paths.set_enabled(previous)
    return out


def _request_view(r) -> tuple:
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
    )


def assert_identical(plain, fast) -> None:
    assert plain.duration == fast.duration
    assert [_request_view(r) for r in plain.requests] == [_request_view(r) for r in fast.requests]
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
        workload = [_with_prefix(w, rng.choice(prefixes)) for w in workload]
    return cluster, workload, max_concurrency


def _with_prefix(w: WorkloadRequest, prefix: tuple[int, int]) -> WorkloadRequest:
    own = (segment_key(f"user/{w.request_id}"), w.prompt_len)
    return dataclasses.replace(w, prompt_len=prefix[1] + w.prompt_len, prompt_segments=(prefix, own))


@pytest.mark.parametrize("seed", range(40))
def test_fast_paths_change_nothing_on_random_scenarios(seed: int) -> None:
    rng = random.Random(1000 + seed)
    cluster, workload, max_concurrency = random_scenario(rng)
    spec = ClusterSpec.model_validate(cluster)
    plain, fast = _both(spec, workload, seed=seed, max_concurrency=max_concurrency)
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
    plain, fast = _both(spec, workload, seed=seed)
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
    workload = [_with_prefix(w, rng.choice(prefixes)) for w in _poisson(rng.randint(30, 60), 10.0, seed)]
    plain, fast = _both(spec, workload, seed=seed)
    assert_identical(plain, fast)
    assert not fast.invariant_errors
    assert fast.extra["steps_fast_forwarded"] > len(fast.steps) // 3
    assert fast.node_counters["decode-0"]["prefix_cache_hits"] > 0


def test_fast_forward_does_most_steps_of_a_light_load() -> None:
    """Requests arrive slower than they finish: most steps are steady decode."""
    spec = _steady_cluster(0, True)
    plain, fast = _both(spec, _poisson(40, 2.0, 11, out=(100, 300)))
    assert_identical(plain, fast)
    assert fast.extra["steps_fast_forwarded"] > len(fast.steps) // 2


def test_fast_forward_stops_when_blocks_run_out() -> None:
    """A pool that fills up during steady decode: the forward stops before
    the allocation that would fail, and the preemptions that follow are
    the same."""
    spec = _steady_cluster(0, True, num_gpu_blocks=60, block_size=4, max_num_seqs=4)
    workload = [WorkloadRequest(f"p{i}", 0.001 * i, 20, 200) for i in range(4)]
    plain, fast = _both(spec, workload)
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
    for hold in (0.5, 1000.0):
        spec = _steady_cluster(1, False).model_copy(update={"kv_hold_timeout_s": hold})
        cluster = InProcCluster(spec, seed=0)
        cluster.submit(workload)
        result = cluster.run()
        assert result.node_counters["prefill-0"]["kv_hold_timeouts"] == 0
        jumps[hold] = [f.jumps for f in cluster._forwarders]
    assert jumps[0.5] == jumps[1000.0]
    plain, fast = _both(_steady_cluster(1, False).model_copy(update={"kv_hold_timeout_s": 0.5}), workload)
    assert_identical(plain, fast)


def test_fast_forward_with_a_closed_loop_backlog() -> None:
    """With a backlog, the proxy's receipt of a finish starts the next request:
    the forward must stop at it (and does, exactly)."""
    spec = _steady_cluster(0, False)
    workload = _poisson(60, 50.0, 7)
    plain, fast = _both(spec, workload, max_concurrency=5)
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
        plain, fast = _both(spec, _poisson(30, 20.0, 3))
        assert_identical(plain, fast)
        assert fast.extra["steps_fast_forwarded"] == 0


def test_records_keep_token_runs_checkable() -> None:
    """Forwarded tokens are kept as runs of output indices: the end-of-run
    check still finds a gap."""
    from cluster.invariants import check_tokens
    from engine.records import RequestRecord, TokenIds
    from engine.sampler import DeterministicSampler

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


@pytest.mark.parametrize("seed", range(3))
def test_a_node_killed_and_clients_going_away_mid_forward_change_nothing_either(seed: int) -> None:
    """A decode node dies while it forwards steady steps (its requests'
    token runs are written out, the requests end with an error), and
    clients go away mid-decode (`abort`): the same results with the fast
    paths off and on."""
    from cluster.inproc import InProcCluster

    rng = random.Random(seed)
    engine = {"num_gpu_blocks": 1000, "enable_prefix_caching": False}
    spec = ClusterSpec.model_validate(
        {
            "prefill": {"count": 1, "engine": dict(engine)},
            "decode": {"count": 1, "engine": dict(engine)},
            "cost_model": "synthetic-8b",
        }
    )
    work = [WorkloadRequest(f"r{i}", i * 0.05, rng.randint(16, 96), rng.randint(100, 300)) for i in range(30)]
    aborts = [(rng.uniform(0.3, 2.0), f"r{rng.randrange(30)}") for _ in range(6)]
    kill_at = rng.uniform(2.0, 3.0)
    results = []
    for on in (False, True):
        previous = fast_paths.set_enabled(on)
        try:
            cluster = InProcCluster(spec, seed=seed)
            cluster.submit(work)
            for at, rid in aborts:
                cluster.loop.at(at, cluster.abort, rid)
            cluster.kill_node_at("decode-0", kill_at)
            results.append(cluster.run())
        finally:
            fast_paths.set_enabled(previous)
    plain, fast = results
    assert_identical(plain, fast)
    reasons = {r.finish_reason for r in fast.requests}
    assert {"abort", "error"} <= reasons and fast.extra["steps_fast_forwarded"] > 0


def _run_with(spec: ClusterSpec, work: list[WorkloadRequest], on: bool, setup=None):
    previous = fast_paths.set_enabled(on)
    try:
        cluster = InProcCluster(spec, seed=0)
        cluster.submit(work)
        if setup is not None:
            setup(cluster)
        return cluster.run()
    finally:
        fast_paths.set_enabled(previous)


def _first_steady_admission_step(spec: ClusterSpec, work: list[WorkloadRequest], monkeypatch) -> float:
    """When the fast path first schedules a step next to a waiting pass (`schedule_with_steady`)."""
    import engine.engine_core as engine_core

    seen: list[float] = []
    queue_step = engine_core.EngineCore.queue_step

    def spy(self, now, so):
        if so.steady is not None and not seen:
            seen.append(now)
        return queue_step(self, now, so)

    with monkeypatch.context() as patch:
        patch.setattr(engine_core.EngineCore, "queue_step", spy)
        _run_with(spec, work, True)
    assert seen
    return seen[0]


@pytest.mark.parametrize("case", ["finishing in that step", "alone, on a jittered proxy link"])
def test_a_client_going_away_while_a_steady_step_is_in_flight_changes_nothing(case: str, monkeypatch) -> None:
    """The abort is applied before the step's update (`EngineCore.process_oldest`):
    the request gets nothing from that step, as on the plain path. Before,
    the steady update still gave it its token: a second free of a request
    that reached its cap in that step (KeyError), or an output message the
    plain path never sends (on a jittered link every later delay moved)."""
    engine = {"num_gpu_blocks": 2000, "enable_prefix_caching": False}
    if case == "finishing in that step":
        spec = ClusterSpec.model_validate(
            {"prefill": {"count": 0}, "decode": {"count": 1, "engine": {**engine, "max_num_seqs": 64}}}
        )
        work = [WorkloadRequest(f"r{i}", 0.02 * i, 50, 40 + (i % 7)) for i in range(60)]
        at = 0.5816773 + 1e-9  # r0 reaches its cap in the admission step in flight then
    else:
        spec = ClusterSpec.model_validate(
            {
                "prefill": {"count": 0},
                "decode": {"count": 1, "engine": {**engine, "max_num_batched_tokens": 64}},
                "links": {"proxy": {"delay_ms": 0.5, "jitter_ms": 0.1}},
            }
        )
        # r1's long prompt is admitted in chunks next to r0's decode: that step's only output is r0's.
        work = [
            WorkloadRequest("r0", 0.0, 30, 300),
            WorkloadRequest("r1", 0.2, 400, 50),
            WorkloadRequest("r2", 0.5, 20, 100),
        ]
        at = _first_steady_admission_step(spec, work, monkeypatch) + 1e-9

    def abort_r0(cluster: InProcCluster) -> None:
        cluster.loop.at(at, cluster.abort, "r0")

    plain, fast = (_run_with(spec, work, on, abort_r0) for on in (False, True))
    assert_identical(plain, fast)
    assert fast.requests[0].finish_reason == "abort"


def test_a_request_rerouted_after_its_decode_node_died_gets_the_same_tokens() -> None:
    """The new node computes it from its prompt plus the tokens delivered so
    far, so its output indices start over there; the client's token runs
    continue the record (before, they restarted at the node's index: wrong ids)."""
    spec = ClusterSpec.model_validate(
        {
            "prefill": {"count": 0},
            "decode": {"count": 2, "engine": {"num_gpu_blocks": 2000, "enable_prefix_caching": False}},
            "routing": "round_robin",
        }
    )
    work = [WorkloadRequest(f"r{i}", 0.01 * i, 40, 200) for i in range(6)]

    def kill(cluster: InProcCluster) -> None:
        cluster.kill_node_at("decode-0", 0.8)

    plain, fast = (_run_with(spec, work, on, kill) for on in (False, True))
    assert_identical(plain, fast)
    assert fast.extra["rerouted"] and fast.invariant_errors == []


def _scenario_with_faults(rng: random.Random):
    """`random_scenario`, wider: a small `max_model_len`, per-request stop
    ids, `ignore_eos` and `min_tokens`, clients going away at random times,
    and a decode node killed (and maybe restarted)."""
    cluster, workload, max_concurrency = random_scenario(rng)
    max_model_len = rng.choice([64, 128, 512, 2048])
    for role in ("prefill", "decode"):
        cluster[role]["engine"]["max_model_len"] = max_model_len
    if rng.random() < 0.5:
        cluster["decode"]["pp_size"] = 1
        cluster["decode"]["engine"]["async_scheduling"] = False
    if rng.random() < 0.5:
        cluster["decode"]["engine"]["enable_prefix_caching"] = False
    work = []
    for w in workload:
        extra: dict = {}
        x = rng.random()
        if x < 0.1:
            extra["stop_token_ids"] = (rng.randint(3, 50),)
        elif x < 0.2:
            extra["ignore_eos"] = rng.random() < 0.5
        elif x < 0.3:
            extra["min_tokens"] = rng.randint(0, 20)
        prompt_len = min(w.prompt_len, max_model_len - 1)
        work.append(WorkloadRequest(w.request_id, w.arrival_time, prompt_len, w.output_len, w.priority, **extra))
    aborts = [(rng.uniform(0, 3.0), rng.choice(work).request_id) for _ in range(rng.choice([0, 0, 3, 10]))]
    kill = None
    if rng.random() < 0.2 and cluster["decode"]["count"] == 1:
        kill = (rng.uniform(0.2, 3.0), rng.random() < 0.5)  # (when, restarted 0.3 s later)

    def setup(c: InProcCluster) -> None:
        for at, rid in aborts:
            c.loop.at(at, c.abort, rid)
        if kill is not None:
            c.kill_node_at("decode-0", kill[0])
            if kill[1]:
                c.restart_node_at("decode-0", kill[0] + 0.3)

    return ClusterSpec.model_validate(cluster), work, max_concurrency, setup


@pytest.mark.parametrize("seed", range(24))
def test_random_scenarios_with_faults_and_stop_conditions_are_identical(seed: int) -> None:
    spec, work, max_concurrency, setup = _scenario_with_faults(random.Random(seed))
    results = []
    for on in (False, True):
        previous = fast_paths.set_enabled(on)
        try:
            cluster = InProcCluster(spec, seed=seed)
            cluster.submit(work, max_concurrency)
            setup(cluster)
            results.append(cluster.run())
        finally:
            fast_paths.set_enabled(previous)
    assert_identical(*results)
