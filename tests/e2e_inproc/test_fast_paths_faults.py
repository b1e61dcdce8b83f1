"""The fast paths change nothing under faults (issue 15): a decode node
killed (and restarted) while it forwards steady steps, clients going away
mid-decode or while a steady step is in flight, a request rerouted after its
node died, and random scenarios with those faults and per-request stop
conditions. The same results bit for bit with the fast paths off and on
(`assert_identical`, fast_paths_helpers.py)."""

from __future__ import annotations

import random

import pytest

from cluster.inproc.cluster import InProcCluster
from cluster.spec import ClusterSpec
from engine import compiled
from engine.records import WorkloadRequest

from .fast_paths_helpers import (  # noqa: F401  (check_the_steady_cohort: an autouse fixture)
    assert_identical,
    check_the_steady_cohort,
    random_scenario,
    run_with,
)


@pytest.mark.parametrize("seed", range(3))
def test_a_node_killed_and_clients_going_away_mid_forward_change_nothing_either(seed: int) -> None:
    """A decode node dies while it forwards steady steps (its requests'
    token runs are written out, the requests end with an error), and
    clients go away mid-decode (`abort`): the same results with the fast
    paths off and on."""
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

    def faults(cluster: InProcCluster) -> None:
        for at, rid in aborts:
            cluster.loop.at(at, cluster.abort, rid)
        cluster.kill_node_at("decode-0", kill_at)

    plain, fast = (run_with(spec, work, on, faults, seed=seed) for on in (False, True))
    assert_identical(plain, fast)
    reasons = {r.finish_reason for r in fast.requests}
    assert {"abort", "error"} <= reasons and fast.extra["steps_fast_forwarded"] > 0


def _first_steady_admission_step(spec: ClusterSpec, work: list[WorkloadRequest], monkeypatch) -> float:
    """When the fast path first schedules a step next to a waiting pass (`schedule_with_steady`)."""
    import engine.engine_core as engine_core

    if compiled.build_label() != "pure":
        pytest.skip("spies on EngineCore.queue_step: a compiled class's methods cannot be patched (docs/compiled.md)")
    seen: list[float] = []
    queue_step = engine_core.EngineCore.queue_step

    def spy(self, now, so):
        if so.steady is not None and not seen:
            seen.append(now)
        return queue_step(self, now, so)

    with monkeypatch.context() as patch:
        patch.setattr(engine_core.EngineCore, "queue_step", spy)
        run_with(spec, work, True)
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

    plain, fast = (run_with(spec, work, on, abort_r0) for on in (False, True))
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

    plain, fast = (run_with(spec, work, on, kill) for on in (False, True))
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
    results = [run_with(spec, work, on, setup, seed=seed, max_concurrency=max_concurrency) for on in (False, True)]
    assert_identical(*results)
