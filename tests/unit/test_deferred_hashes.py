"""Deferred prefix-cache hashes (engine/deferred_hashes.py) against hashing
at once: two block pools driven by the same random script of admissions
(prefix lookups, hits touched, prompt blocks cached), decode blocks cached
(at once on one pool, deferred on the other, as the steady paths do), frees,
re-admissions of freed requests looking their whole prefix up (their own
decode blocks hit), and requests sent again under the same id (the same
sampled tokens: duplicate hashes). After every operation the lookups' block
ids, the free queue's order and which blocks are cached are the same; at the
end, with every deferred hash worked out, so is the hash map itself
(duplicates in caching order)."""

from __future__ import annotations

import random

import pytest

from engine.block_hash import first_block_hash, update_block_hashes
from engine.block_pool import BlockPool
from engine.deferred_hashes import PENDING
from engine.prompt import PromptTokens
from engine.request import Request, SamplingParams
from engine.sampler import DeterministicSampler

BS = 4


class _Side:
    def __init__(self, num_blocks: int, deferred: bool, sampler: DeterministicSampler) -> None:
        self.pool = BlockPool(num_blocks, enable_caching=True)
        self.deferred = deferred
        self.sampler = sampler
        self.requests: dict[str, Request] = {}
        self.tables: dict[str, list] = {}
        self.cached: dict[str, int] = {}

    def admit(self, rid: str, prompt: PromptTokens, fresh: bool) -> list[int] | None:
        """Look the request's prefix up (a fresh Request, or the freed one
        again with its outputs), take the hit and new blocks for the rest,
        cache its full blocks. None when the pool is too small."""
        if fresh or rid not in self.requests:
            self.requests[rid] = Request(rid, prompt, SamplingParams(max_tokens=10_000))
        r = self.requests[rid]
        hashes = update_block_hashes(r, BS)
        hit = self.pool.get_cached_prefix(hashes[: (r.num_tokens - 1) // BS])
        need = -(-r.num_tokens // BS) - len(hit)
        free_hits = sum(1 for b in hit if b.ref_cnt == 0)
        if need + free_hits > self.pool.get_num_free_blocks():
            return None
        self.pool.touch(hit)
        table = self.tables[rid] = list(hit) + self.pool.get_new_blocks(need)
        self.pool.cache_full_blocks(table, hashes, len(hit), r.num_tokens // BS, rid)
        self.cached[rid] = r.num_tokens // BS
        return [b.block_id for b in hit]

    def decode_block(self, rid: str) -> bool:
        """Sample a block's worth of tokens, take a block if needed, cache what is full."""
        r, table = self.requests[rid], self.tables[rid]
        if -(-(r.num_tokens + BS) // BS) > len(table):
            if self.pool.get_num_free_blocks() < 1:
                return False
            table += self.pool.get_new_blocks(1)
        r.append_output_token_ids(self.sampler.tokens_at(rid, r.num_tokens, BS))
        num_full = r.num_tokens // BS
        have = len(r.block_hashes)
        if self.deferred and have:
            if self.cached[rid] < have:
                self.pool.cache_full_blocks(table, r.block_hashes, self.cached[rid], min(have, num_full), rid)
            if num_full > have:
                self.pool.deferred.defer(r, table, max(self.cached[rid], have), num_full, BS, self.sampler.tokens_at)
        else:
            hashes = update_block_hashes(r, BS)
            self.pool.cache_full_blocks(table, hashes, self.cached[rid], num_full, rid)
        self.cached[rid] = num_full
        return True

    def free(self, rid: str) -> None:
        self.pool.free_blocks(reversed(self.tables.pop(rid)))
        del self.cached[rid]

    def view(self) -> tuple:
        pool = self.pool
        return (
            [b.block_id for b in pool.free_block_queue],
            [b.block_id for b in pool.blocks if b.block_hash is not None],
            {rid: [b.block_id for b in t] for rid, t in self.tables.items()},
        )


def _hash_map(pool: BlockPool) -> dict:
    return {
        h: ([b.block_id for b in held.values()] if isinstance(held, dict) else [held.block_id])
        for h, held in pool.cached_block_hash_to_block.items()
    }


@pytest.mark.parametrize("seed", range(40))
def test_deferred_hashes_match_hashing_at_once(seed: int) -> None:
    rng = random.Random(seed)
    sampler = DeterministicSampler(seed=seed)
    num_blocks = rng.randint(12, 40)
    eager, lazy = _Side(num_blocks, False, sampler), _Side(num_blocks, True, sampler)
    shared = [(1000 + k, rng.randint(1, 3 * BS)) for k in range(3)]
    prompts: dict[str, PromptTokens] = {}
    deferred_seen = 0
    for step in range(300):
        op = rng.random()
        running = sorted(eager.tables)
        if op < 0.3 or not running:
            rid = str(rng.randint(0, 12))
            if rid in eager.tables:
                continue
            fresh = rid not in prompts or rng.random() < 0.3  # (sent again: the same id, the same tokens)
            if rid not in prompts:
                segs = [shared[rng.randrange(len(shared))]] if rng.random() < 0.6 else []
                prompts[rid] = PromptTokens(segs + [(rng.getrandbits(32), rng.randint(1, 3 * BS))])
            results = [side.admit(rid, prompts[rid], fresh) for side in (eager, lazy)]
            assert results[0] == results[1], f"step {step}: lookup of {rid}"
            if results[0] is None:
                for side in (eager, lazy):
                    side.requests.pop(rid, None)
                prompts.pop(rid)
        elif op < 0.8:
            rid = rng.choice(running)
            assert eager.decode_block(rid) == lazy.decode_block(rid)
        else:
            rid = rng.choice(running)
            eager.free(rid)
            lazy.free(rid)
        deferred_seen = max(deferred_seen, sum(1 for b in lazy.pool.blocks if b.block_hash == PENDING))
        assert eager.view() == lazy.view(), f"step {step}"
    assert deferred_seen > 0
    lazy.pool.deferred.materialize_all()
    assert len(lazy.pool.deferred) == 0
    assert _hash_map(eager.pool) == _hash_map(lazy.pool)
    assert [b.block_hash for b in eager.pool.blocks] == [b.block_hash for b in lazy.pool.blocks]


@pytest.mark.parametrize("growing", [False, True])
def test_chains_under_one_parent_go_in_in_caching_order(growing: bool) -> None:
    """Two requests with one prompt, both chains under its first block (the
    first request's copy of it lost its hash: a failed KV load's
    `evict_blocks`), the second's materialised first (its own plain-path
    caching): the duplicates still go in first-cached first, whether the
    first chain was complete when the second began (`growing` False) or
    grew after it."""
    sampler = DeterministicSampler(seed=1)
    pools = {"eager": BlockPool(32, enable_caching=True), "lazy": BlockPool(32, enable_caching=True)}
    reqs = {
        (side, rid): Request(rid, PromptTokens([(77, 5 * BS)]), SamplingParams(max_tokens=10))
        for side in pools
        for rid in "ab"
    }
    tables = {}

    def cache(side: str, rid: str, start: int, stop: int) -> None:
        pool, r, table = pools[side], reqs[(side, rid)], tables[(side, rid)]
        hashes = update_block_hashes(r, BS) if side == "eager" else first_block_hash(r, BS)
        if side == "eager" or start == 0:
            pool.cache_full_blocks(table, hashes, start, stop if side == "eager" else 1, rid)
        if side == "lazy" and stop > max(start, 1):
            pool.deferred.defer(r, table, max(start, 1), stop, BS, sampler.tokens_at)

    for side, pool in pools.items():
        tables[(side, "a")] = pool.get_new_blocks(5)
        cache(side, "a", 0, 3 if growing else 5)
        pool.evict_blocks([tables[(side, "a")][0].block_id])
        assert pool.get_cached_prefix(update_block_hashes(reqs[(side, "b")], BS)) == []
        tables[(side, "b")] = pool.get_new_blocks(5)
        cache(side, "b", 0, 5)
        if growing:
            cache(side, "a", 3, 5)
    lazy = pools["lazy"]
    assert sum(1 for b in lazy.blocks if b.block_hash == PENDING) == 8
    lazy.deferred.materialize(lazy.deferred.by_request["b"])  # (b's own chain first)
    assert len(lazy.deferred) == 0
    assert _hash_map(pools["eager"]) == _hash_map(lazy)
