"""The shadow KV store's range form (engine/shadow_kv.py, issue 15) finds
exactly what the tag-per-slot store it replaced finds
(tests/e2e_inproc/shadow_kv_tag_per_slot.py): the same violations in the
same order, the same counters, the same read results, the same swap
snapshots — on random operation sequences driven into both stores, and on
random cluster runs with shadow KV on (fence-off cascades that corrupt KV,
prefix-cache hits, KV loss on the pull link, v0 swaps), run once with each
store. Both runs must also agree on everything else a run reports.
"""

from __future__ import annotations

import random

import pytest

import engine.node_core
from cluster.inproc import run_inproc
from cluster.spec import ClusterSpec
from engine import fast_paths
from engine.prompt import segment_key
from engine.records import WorkloadRequest
from engine.shadow_kv import ShadowKVStore

from .fast_paths_helpers import request_view
from .shadow_kv_tag_per_slot import ShadowKVStore as TagPerSlotStore


# -- the two stores side by side, operation by operation -------------------------------------
def _state(s, seen: int) -> tuple:
    """Counters, bad-block sets and the violations reported after the first `seen`."""
    new = [(v.kind, v.time, v.block_id, v.request_id, v.owner, v.position) for v in s.violations[seen:]]
    return s.summary(), s._bad, new


def _drive(seed: int, ranges: bool) -> set[str]:
    rng = random.Random(seed)
    num_blocks, bs = rng.choice([(6, 4), (12, 4), (10, 16)])
    hashes = rng.random() < 0.5
    expected = (lambda rid, i: hash((rid, i)) % 5) if hashes else None  # few values: collisions happen
    previous = fast_paths.set_enabled(ranges)
    try:
        old = TagPerSlotStore(num_blocks, bs, expected_hash=expected)
        new = ShadowKVStore(num_blocks, bs, expected_hash=expected)
    finally:
        fast_paths.set_enabled(previous)
    reqs = ["a", "b", "c", "d"]
    tables: dict[str, list[int]] = {r: [] for r in reqs}
    cpu: list[tuple[list | None, list | None]] = []
    now = 0.0
    seen = 0
    for step in range(300):
        now += 0.001
        rid = rng.choice(reqs)
        table = tables[rid]
        op = rng.random()
        if op < 0.15 or not table:
            blocks = rng.sample(range(num_blocks), rng.randint(1, 3))
            if rng.random() < 0.3:
                tables[rid] = table = []  # a fresh table (a preemption, a new request)
            table.extend(blocks)
            old.assign(blocks, rid)
            new.assign(blocks, rid)
        elif op < 0.22:
            first = rng.randint(0, 2)
            blocks = rng.sample(range(num_blocks), rng.randint(1, 2))
            old.share(blocks, rid, first)
            new.share(blocks, rid, first)
        elif op < 0.6:
            # Writes mostly extend what the request wrote, sometimes anywhere.
            top = len(table) * bs
            start = rng.randint(0, top - 1)
            if rng.random() < 0.6:
                start = min(top - 1, max(0, new._verified.get(rid, (None, 0))[1]))
            end = rng.randint(start + 1, min(top, start + 2 * bs))
            if rng.random() < 0.5 and end - start <= bs:
                n = end - start
                t1, t2 = now, now + 0.0005
                old.read(rid, table, start, t1)
                old.write(rid, table, start, end, t2)
                if n > 1:
                    old.read(rid, table, end - 1, t2)
                new.decode(rid, table, start, n, t1, t2)
            else:
                old.write(rid, table, start, end, now)
                new.write(rid, table, start, end, now)
        elif op < 0.85:
            n = rng.randint(0, len(table) * bs)
            assert old.read(rid, table, n, now) == new.read(rid, table, n, now), step
        elif op < 0.9:
            old.forget(rid)
            new.forget(rid)
        elif op < 0.95:
            b = rng.randrange(num_blocks)
            snaps = (old.snapshot_block(b), new.snapshot_block(b))
            assert snaps[0] == snaps[1], step
            cpu.append(snaps)
        elif cpu:
            b = rng.randrange(num_blocks)
            o, n_ = cpu.pop(rng.randrange(len(cpu)))
            old.restore_block(b, o)
            new.restore_block(b, n_)
        assert _state(old, seen) == _state(new, seen), step
        seen = len(new.violations)
        assert old.owned == new.owned and old.foreign == new.foreign and old.content == new.content, step
    return {v.kind for v in new.violations}


@pytest.mark.parametrize("ranges", [True, False], ids=["ranges", "plain"])
@pytest.mark.parametrize("seed", range(60))
def test_the_stores_agree_operation_by_operation(seed: int, ranges: bool) -> None:
    _drive(seed, ranges)


def test_operation_sequences_find_every_kind_of_violation() -> None:
    """The sequences above are not vacuous: together they hit every finding."""
    kinds = set().union(*(_drive(seed, True) for seed in range(60)))
    assert kinds == {"stale_write", "read_foreign", "read_hit_mismatch", "read_missing"}


# -- whole runs with either store --------------------------------------------------------------
def _run_with(store, spec: ClusterSpec, workload: list[WorkloadRequest], seed: int):
    saved = engine.node_core.ShadowKVStore
    engine.node_core.ShadowKVStore = store
    try:
        return run_inproc(spec, workload, seed=seed)
    finally:
        engine.node_core.ShadowKVStore = saved


def _scenario(rng: random.Random) -> tuple[dict, list[WorkloadRequest]]:
    kind = rng.choice(["cascade", "cascade", "prefix", "kv_loss", "v0_swap", "mixed"])
    bs = rng.choice([4, 16])
    engine_cfg: dict = {
        "num_gpu_blocks": rng.choice([60, 120, 250]) * (16 // bs),
        "block_size": bs,
        "max_num_seqs": rng.choice([16, 64]),
        "max_num_batched_tokens": 2048,
        "max_model_len": 2048,
        "enable_prefix_caching": kind in ("prefix", "mixed") or rng.random() < 0.2,
    }
    cluster: dict = {"cost_model": "synthetic-8b", "shadow_kv": True}
    if kind == "cascade":
        # Two batches in flight with the fence forced off: freed blocks are
        # reused under in-flight writes (corruptions).
        engine_cfg.update(async_scheduling=True, fence="off", preemption_guard=rng.choice(["prefix", "fixed"]))
        cluster["prefill"] = {"count": rng.choice([0, 1])}
        cluster["links"] = {"kv": {"delay_ms": 1.0}}
    elif kind == "prefix":
        engine_cfg.update(fence=rng.choice(["auto", "off"]), async_scheduling=rng.random() < 0.5)
        cluster["prefill"] = {"count": 0}
    elif kind == "kv_loss":
        cluster["prefill"] = {"count": 1}
        cluster["links"] = {"kv": {"delay_ms": 1.0, "loss": rng.choice([0.2, 0.5])}}
        cluster.update(kv_pull_timeout_s=0.2, kv_pull_deadline_s=1.0, kv_hold_timeout_s=3.0)
    elif kind == "v0_swap":
        engine_cfg.update(
            engine="v0",
            num_cpu_blocks=engine_cfg["num_gpu_blocks"] * 2,
            preemption_mode="swap",
            enable_prefix_caching=False,
        )
        cluster["prefill"] = {"count": 0}
    else:
        engine_cfg.update(async_scheduling=rng.random() < 0.5, fence=rng.choice(["auto", "off"]))
        cluster["prefill"] = {"count": rng.choice([0, 1])}
        cluster["sampler"] = {"stop_probability": rng.choice([0.0, 0.01])}
    cluster["decode"] = {"count": 1, "engine": engine_cfg}
    cluster["prefill"]["engine"] = {"block_size": bs, "num_gpu_blocks": 4000}
    # Some prompts start with one of a few shared segments (a system prompt),
    # so that the prefix cache hits.
    shared = rng.choice([0, 1, 3]) if engine_cfg["enable_prefix_caching"] else 0
    n = rng.randint(15, 50)
    rate = rng.choice([20.0, 100.0, 400.0])
    t = 0.0
    workload = []
    for i in range(n):
        t += rng.expovariate(rate)
        prompt = rng.randint(16, 300)
        segments: tuple = ()
        if shared and rng.random() < 0.7:
            head = rng.randint(1, prompt)
            segments = ((segment_key(f"shared{rng.randrange(shared)}"), head),)
            if prompt > head:
                segments += ((segment_key(f"own{rng.random()}-{i}"), prompt - head),)
        workload.append(WorkloadRequest(f"r{i}", round(t, 6), prompt, rng.randint(8, 160), prompt_segments=segments))
    return cluster, workload


def _findings(result) -> tuple:
    counters = {
        n: {k: v for k, v in c.items() if "shadow" in k or "corrupt" in k} for n, c in result.node_counters.items()
    }
    return counters, result.violations


SCENARIOS = 36


@pytest.mark.parametrize("seed", range(SCENARIOS))
def test_runs_find_the_same_with_either_store(seed: int) -> None:
    rng = random.Random(5000 + seed)
    cluster, workload = _scenario(rng)
    spec = ClusterSpec.model_validate(cluster)
    old = _run_with(TagPerSlotStore, spec, workload, seed)
    new = _run_with(ShadowKVStore, spec, workload, seed)
    assert _findings(old) == _findings(new)
    # Everything else a run reports, the fast-forward's statistics included:
    # the stores' bad-block sets, which decide what it may forward, agree too.
    assert old.duration == new.duration
    assert [request_view(r) for r in old.requests] == [request_view(r) for r in new.requests]
    assert [s.to_dict() for s in old.steps] == [s.to_dict() for s in new.steps]
    assert old.node_counters == new.node_counters
    assert old.invariant_errors == new.invariant_errors
    assert old.extra == new.extra


def test_the_random_runs_cover_corruptions_hits_and_loss() -> None:
    """The scenarios above include runs with corruptions (and every counter
    agrees there too), prefix-cache hits and failed KV pulls."""
    corrupt = hits = lost = 0
    for seed in range(SCENARIOS):
        rng = random.Random(5000 + seed)
        cluster, workload = _scenario(rng)
        result = _run_with(ShadowKVStore, ClusterSpec.model_validate(cluster), workload, seed)
        c = result.node_counters
        corrupt += sum(x.get("kv_corruptions_detected", 0) for x in c.values()) > 0
        hits += sum(x.get("prefix_cache_hits", 0) for x in c.values()) > 0
        lost += sum(x.get("kv_pulls_failed", 0) + x.get("transport_retries", 0) for x in c.values()) > 0
    assert corrupt >= 3 and hits >= 3 and lost >= 2, (corrupt, hits, lost)
