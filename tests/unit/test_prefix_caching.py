"""Automatic prefix caching, pinned the way vLLM's prefix-caching tests pin
it: build a scheduler, add requests with explicit prompts, drive
`schedule()` / `update_from_output()` by hand, assert exact block ids,
hits and free-queue order (vLLM 0.33.0's rules; the differential harness in
tests/conformance checks the same against vLLM itself)."""

from __future__ import annotations

from engine.block_pool import BlockPool
from engine.kv_cache_manager import KVCacheManager
from engine.request import RequestStatus
from engine.testing import create_requests, create_scheduler, make_model_runner_output


def prompt(tag: int, n: int) -> list[int]:
    return [tag * 100 + i for i in range(n)]


def run_to_finish(s, max_steps: int = 100) -> None:
    for _ in range(max_steps):
        if not s.has_requests():
            return
        out = s.schedule()
        s.update_from_output(out, make_model_runner_output(out, token_id=7))


def admit(s, request) -> int:
    """Add and schedule one request; the tokens it had computed on admission (its hit)."""
    s.add_request(request)
    out = s.schedule()
    hit = request.num_computed_tokens - out.num_scheduled_tokens[request.request_id]
    s.update_from_output(out, make_model_runner_output(out, token_id=7))
    return hit


def test_a_repeat_hits_full_blocks_and_recomputes_the_last_token():
    s = create_scheduler(enable_prefix_caching=True, num_blocks=50)
    a, b, c, d = create_requests(
        4, max_tokens=1, prompt_token_ids=[prompt(1, 32), prompt(1, 32), prompt(2, 40), prompt(2, 40)]
    )
    assert admit(s, a) == 0
    run_to_finish(s)
    assert admit(s, b) == 16  # 2 full blocks cached, but the last token must be recomputed
    run_to_finish(s)
    admit(s, c)
    run_to_finish(s)
    assert admit(s, d) == 32  # a ragged prompt: only its full blocks are cached
    assert d.num_cached_tokens == 32
    stats = s.kv_cache_manager.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (4, 32 + 32 + 40 + 40, 16 + 32)


def test_shared_blocks_are_referenced_twice_and_survive_one_free():
    s = create_scheduler(enable_prefix_caching=True, num_blocks=50)
    a, b = create_requests(2, max_tokens=5, prompt_token_ids=[prompt(1, 48), prompt(1, 48)])
    admit(s, a)
    assert admit(s, b) == 32
    kvm = s.kv_cache_manager
    a_blocks, b_blocks = kvm.req_to_blocks["0"], kvm.req_to_blocks["1"]
    assert a_blocks[:2] == b_blocks[:2] and all(blk.ref_cnt == 2 for blk in a_blocks[:2])
    s.finish_requests(["0"], RequestStatus.FINISHED_ABORTED)
    assert all(blk.ref_cnt == 1 for blk in b_blocks[:2])
    assert all(blk not in kvm.block_pool.free_block_queue for blk in b_blocks[:2])


def test_freed_cached_blocks_go_to_the_tail_tail_first_and_are_evicted_from_the_head():
    pool = BlockPool(8, enable_caching=True)
    blocks = pool.get_new_blocks(3)  # ids 1, 2, 3
    pool.cache_full_blocks(blocks, [11, 12, 13], 0, 3)
    unhashed = pool.get_new_blocks(1)  # id 4
    pool.free_blocks(reversed(blocks))
    pool.free_blocks(unhashed)
    # Unhashed first (reused first), then the never-used, then the cached tail-first.
    assert [b.block_id for b in pool.free_block_queue] == [4, 5, 6, 7, 3, 2, 1]
    taken = pool.get_new_blocks(5)  # 4, 5, 6, 7 and then evicts block 3
    assert [b.block_id for b in taken] == [4, 5, 6, 7, 3]
    assert pool.get_cached_block(13) is None and pool.get_cached_block(11) is blocks[0]
    assert taken[-1].block_hash is None


def test_blocks_sharing_a_hash_are_kept_and_the_first_cached_is_the_hit():
    """vLLM keeps duplicates (two blocks with one hash, e.g. two requests
    computing the same prompt in one step) and returns the first cached;
    evicting one leaves the others, in caching order."""
    pool = BlockPool(8, enable_caching=True)
    a, b, c = pool.get_new_blocks(3)
    for blk in (a, b, c):
        pool.cache_block(blk, 42)
    pool.cache_block(a, 43)  # a block already hashed keeps its entry
    assert pool.get_cached_block(42) is a and a.block_hash == 42
    assert len(pool.cached_block_hash_to_block) == 1
    pool.free_blocks([a, b, c])
    pool._evict(b)
    assert pool.get_cached_block(42) is a
    pool._evict(a)
    assert pool.get_cached_block(42) is c
    pool.cache_block(b, 42)
    assert pool.get_cached_block(42) is c  # still the first cached of those left
    pool._evict(c)
    pool._evict(b)
    assert pool.get_cached_block(42) is None and pool.cached_block_hash_to_block == {}
    assert not pool._evict(b)  # no hash: nothing to evict


def test_a_hit_takes_a_free_block_out_of_the_queue_and_counts_against_free_blocks():
    kvm = KVCacheManager(num_gpu_blocks=6, block_size=16, max_model_len=512, enable_caching=True)
    a, b = create_requests(2, max_tokens=1, prompt_token_ids=[prompt(1, 64), prompt(1, 64)])
    assert kvm.allocate_slots(a, 64) is not None
    kvm.free(a)
    assert kvm.block_pool.get_num_free_blocks() == 5
    hit, n = kvm.get_computed_blocks(b)
    assert n == 48 and [blk.block_id for blk in hit.blocks] == [1, 2, 3]
    # 3 hit blocks leave the free queue and 1 new block is needed: 4 of 5 free.
    assert kvm.allocate_slots(b, 16, num_new_computed_tokens=48, new_computed_blocks=hit) is not None
    assert kvm.block_pool.get_num_free_blocks() == 1
    # The new block comes from the head: the never-used block 5, not a's cached block 4.
    assert kvm.get_block_ids("1") == [1, 2, 3, 5]


def test_blocks_of_generated_tokens_are_cached_too():
    s = create_scheduler(enable_prefix_caching=True, num_blocks=50)
    (a,) = create_requests(1, max_tokens=20, prompt_token_ids=[prompt(1, 16)], ignore_eos=True)
    s.add_request(a)
    run_to_finish(s)
    assert a.num_tokens == 36  # every sampled token is 7
    (b,) = create_requests(1, max_tokens=1, prompt_token_ids=[prompt(1, 16) + [7] * 24], req_ids=["b"])
    assert admit(s, b) == 32  # the prompt block and the first block of a's output


def test_a_preempted_request_finds_its_own_blocks_again():
    s = create_scheduler(enable_prefix_caching=True, num_blocks=9, max_num_batched_tokens=256)
    a, b = create_requests(2, max_tokens=60, prompt_token_ids=[prompt(1, 40), prompt(2, 40)], ignore_eos=True)
    s.add_request(a)
    s.add_request(b)
    readmitted_hit = None
    for _ in range(200):
        if not s.has_requests():
            break
        out = s.schedule()
        if b.request_id in out.scheduled_cached_reqs.resumed_req_ids:
            readmitted_hit = b.num_computed_tokens - out.num_scheduled_tokens[b.request_id]
        s.update_from_output(out, make_model_runner_output(out, token_id=7))
    assert b.num_preemptions >= 1
    assert readmitted_hit is not None and readmitted_hit > 0  # what its growth-evicted tail left


def test_reset_prefix_cache_is_refused_while_blocks_are_in_use():
    s = create_scheduler(enable_prefix_caching=True, num_blocks=20)
    a, b = create_requests(2, max_tokens=3, prompt_token_ids=[prompt(1, 32), prompt(1, 32)])
    admit(s, a)
    assert s.kv_cache_manager.reset_prefix_cache() is False
    run_to_finish(s)
    assert s.kv_cache_manager.reset_prefix_cache() is True
    assert admit(s, b) == 0


def test_caching_off_never_hits():
    s = create_scheduler(enable_prefix_caching=False, num_blocks=50)
    a, b = create_requests(2, max_tokens=1, prompt_token_ids=[prompt(1, 64), prompt(1, 64)])
    admit(s, a)
    run_to_finish(s)
    assert admit(s, b) == 0
    assert s.get_counters().get("prefix_cache_queries") is None


def _decode_steps(enable_fast_paths: bool) -> list[tuple[int, int, list[int]]]:
    """A 6-token prompt decoding 20 tokens in blocks of 4: per step, the
    allocator calls counted so far, the blocks cached and their hashes."""
    from engine import fast_paths

    previous = fast_paths.set_enabled(enable_fast_paths)
    try:
        s = create_scheduler(enable_prefix_caching=True, num_blocks=50, block_size=4)
        (r,) = create_requests(1, max_tokens=20, prompt_token_ids=[prompt(1, 6)])
        s.add_request(r)
        kvm = s.kv_cache_manager
        seen = []
        for _ in range(20):
            out = s.schedule()
            s.update_from_output(out, make_model_runner_output(out, token_id=7))
            blocks = kvm.req_to_blocks.get("0", [])
            seen.append((kvm.num_allocate_slots_calls, kvm.num_cached_block.get("0"), [b.block_hash for b in blocks]))
        return seen
    finally:
        fast_paths.set_enabled(previous)


def test_a_decode_step_that_completes_no_block_needs_no_allocator_call():
    """The fast path that skips `allocate_slots` for a running request whose
    last block has room (engine/scheduler.py) still calls it at the step
    that completes a block, which the call caches: every step's call count,
    cached blocks and hashes are those of calling it every step."""
    plain, fast = _decode_steps(False), _decode_steps(True)
    assert fast == plain
    # 6 prompt tokens + 1 computed per decode step: blocks complete at 8, 12, 16, 20, 24 tokens.
    assert [cached for _, cached, _ in plain][:8] == [1, 1, 2, 2, 2, 2, 3, 3]
    assert [calls for calls, _, _ in plain] == list(range(1, 21))
