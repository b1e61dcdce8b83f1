"""Deferred prompt hashes (`KVCacheManager.defer_prompt_hashes`,
engine/deferred_hashes.py) against hashing at once: two v1 schedulers with
prefix caching, one deferring, driven by the same random requests (prompts
sharing prefixes of several blocks, prompts repeated whole, chunked
prefills, pools small enough to preempt and evict). After every step the
scheduled work, every request's computed tokens and block ids, the free
queue's order, which blocks are cached and the prefix-cache stats are the
same; at the end, with every deferred hash worked out, so is the hash map
(duplicates in caching order)."""

from __future__ import annotations

import random

import pytest

from engine.block_pool import BlockPool
from engine.deferred_hashes import PENDING
from engine.sampler import DeterministicSampler
from engine.testing import create_requests, create_scheduler, make_model_runner_output

BS = 4


def _hash_map(pool: BlockPool) -> dict:
    return {
        h: ([b.block_id for b in held.values()] if isinstance(held, dict) else [held.block_id])
        for h, held in pool.cached_block_hash_to_block.items()
    }


def _view(s) -> tuple:
    kvm = s.kv_cache_manager
    pool = kvm.block_pool
    return (
        [b.block_id for b in pool.free_block_queue],
        [b.block_id for b in pool.blocks if b.block_hash is not None],
        {rid: [b.block_id for b in t] for rid, t in kvm.req_to_blocks.items()},
        {rid: (r.status.name, r.num_computed_tokens) for rid, r in s.requests.items()},
        dict(kvm.num_cached_block),
        (kvm.prefix_cache_stats.requests, kvm.prefix_cache_stats.queries, kvm.prefix_cache_stats.hits),
    )


def _prompts(rng: random.Random, n: int) -> list[list[int]]:
    """Prompts made of shared heads (1-4 blocks and a bit) and own tails; some repeated whole."""
    heads = [[rng.randrange(1, 50_000) for _ in range(rng.randint(1, 4 * BS + 2))] for _ in range(3)]
    out: list[list[int]] = []
    for _ in range(n):
        if out and rng.random() < 0.15:
            out.append(list(rng.choice(out)))
            continue
        head = rng.choice(heads) if rng.random() < 0.7 else []
        out.append(head + [rng.randrange(1, 50_000) for _ in range(rng.randint(1, 5 * BS))])
    return out


@pytest.mark.parametrize("seed", range(30))
def test_deferred_prompt_hashes_match_hashing_at_once(seed: int) -> None:
    _run(seed)


def test_some_runs_share_blocks() -> None:
    assert any(_run(seed) for seed in range(5))


def _run(seed: int) -> int:
    """One random run; the most blocks held twice at once."""
    rng = random.Random(seed)
    n = rng.randint(6, 20)
    prompts = _prompts(rng, n)
    max_tokens = [rng.randint(1, 3 * BS) for _ in range(n)]
    settings = dict(
        enable_prefix_caching=True,
        block_size=BS,
        num_blocks=rng.randint(16, 60),
        max_num_seqs=rng.randint(2, 6),
        max_num_batched_tokens=rng.choice([6, 9, 64]),
        max_model_len=64,
    )
    sides = [create_scheduler(**settings) for _ in range(2)]  # type: ignore[arg-type]
    sides[1].kv_cache_manager.defer_prompt_hashes = DeterministicSampler(seed=seed).tokens_at
    arrivals = sorted(rng.randrange(0, 3 * n) for _ in range(n))
    deferred_seen = shared_seen = 0
    step = 0
    while step < 400 and (step <= arrivals[-1] or any(s.has_requests() for s in sides)):
        for i, at in enumerate(arrivals):
            if at == step:
                for s in sides:
                    (r,) = create_requests(
                        1, max_tokens=max_tokens[i], req_ids=[f"r{i}"], prompt_token_ids=[prompts[i]], ignore_eos=True
                    )
                    s.add_request(r)
        outs = [s.schedule() for s in sides]
        assert outs[0].num_scheduled_tokens == outs[1].num_scheduled_tokens, f"step {step}"
        assert outs[0].preempted_req_ids == outs[1].preempted_req_ids, f"step {step}"
        token_id = rng.randrange(1, 3)  # (few ids: decode blocks that hash alike)
        for s, out in zip(sides, outs):
            s.update_from_output(out, make_model_runner_output(out, token_id=token_id))
        pool = sides[1].kv_cache_manager.block_pool
        deferred_seen = max(deferred_seen, sum(1 for b in pool.blocks if b.block_hash == PENDING))
        assert _view(sides[0]) == _view(sides[1]), f"step {step}"
        for p in (s.kv_cache_manager.block_pool for s in sides):  # (`num_shared`: what `block_plan` reads)
            assert p.num_shared == sum(1 for b in p.blocks if b.ref_cnt >= 2)
            shared_seen = max(shared_seen, p.num_shared)
        step += 1
    assert not any(s.has_requests() for s in sides)
    assert deferred_seen > 0
    return shared_seen
    eager, lazy = (s.kv_cache_manager.block_pool for s in sides)
    lazy.deferred.materialize_all()
    assert len(lazy.deferred) == 0
    assert _hash_map(eager) == _hash_map(lazy)
    assert [b.block_hash for b in eager.blocks] == [b.block_hash for b in lazy.blocks]
