"""The shadow KV store catches what the fence prevents."""

import random

import pytest

from engine.sampler import DeterministicSampler
from engine.shadow_kv import ShadowKVStore


def test_clean_write_then_read():
    s = ShadowKVStore(num_blocks=8, block_size=4)
    s.assign([1, 2], "a")
    s.write("a", [1, 2], 0, 6, now=0.0)
    assert s.read("a", [1, 2], 6, now=1.0)
    assert s.num_corruptions == 0


def test_stale_write_on_reassigned_block_is_reported_and_read_finds_foreign():
    s = ShadowKVStore(num_blocks=8, block_size=4)
    s.assign([1], "a")
    s.write("a", [1], 0, 4, now=0.0)
    s.assign([1], "b")  # freed and handed to b while a's step is in flight
    s.write("b", [1], 0, 4, now=1.0)  # b's KV lands first (e.g. a pull)
    s.write("a", [1], 4 - 1, 4, now=2.0)  # a's in-flight step lands on b's block
    assert s.num_stale_writes == 1 and s.num_clobbered_slots == 1
    assert not s.read("b", [1], 4, now=3.0)
    assert s.num_read_foreign == 1
    assert s.violations[0].kind == "stale_write" and s.violations[0].owner == "b"


def test_read_of_missing_content_is_reported():
    s = ShadowKVStore(num_blocks=8, block_size=4)
    s.assign([3], "a")
    s.write("a", [3], 0, 2, now=0.0)
    assert not s.read("a", [3], 4, now=1.0)
    assert s.num_read_missing == 1


def test_owner_overwrite_heals_a_stale_slot():
    s = ShadowKVStore(num_blocks=8, block_size=4)
    s.assign([1], "b")
    s.write("a", [1], 0, 1, now=0.0)  # stale write first
    s.write("b", [1], 0, 4, now=1.0)  # the new owner's own write after it
    assert s.read("b", [1], 4, now=2.0)
    assert s.num_stale_writes == 1 and s.num_clobbered_slots == 0


def test_sampler_is_deterministic_per_position():
    a, b = DeterministicSampler(7, 0.1), DeterministicSampler(7, 0.1)
    assert [a.token_at("r", p) for p in range(50)] == [b.token_at("r", p) for p in range(50)]
    assert [DeterministicSampler(8).token_at("r", p) for p in range(50)] != [a.token_at("r", p) for p in range(50)]
    eos = sum(DeterministicSampler(1, 0.25).token_at("x", p) == 2 for p in range(4000))
    assert 850 < eos < 1150


def test_a_stale_table_read_after_the_block_moved_on_is_foreign():
    s = ShadowKVStore(num_blocks=8, block_size=4)
    s.assign([1, 2], "a")
    s.write("a", [1, 2], 0, 8, now=0.0)
    assert s.read("a", [1, 2], 8, now=0.5)
    s.assign([2], "b")  # block 2 freed and reused while a step of a is in flight
    assert not s.read("a", [1, 2], 8, now=1.0)
    assert s.num_read_foreign == 1 and s.violations[-1].block_id == 2


def test_incremental_reads_still_catch_a_later_clobber():
    s = ShadowKVStore(num_blocks=8, block_size=4)
    s.assign([1, 2], "a")
    s.write("a", [1, 2], 0, 8, now=0.0)
    table = [1, 2]
    assert s.read("a", table, 8, now=0.5)
    s.write("x", [1], 0, 2, now=0.6)  # a stale writer lands on a's first block
    assert not s.read("a", table, 8, now=1.0)
    s.write("a", [1], 0, 2, now=1.1)  # a rewrites it: clean again
    assert s.read("a", table, 8, now=1.2)


def test_a_preempted_requests_reads_test_its_lost_blocks_against_every_new_one():
    """A request keeps the blocks it lost in its bad set; a read through its
    new table tests only the blocks no earlier read found clear of that set,
    so one it loses later, or one of its lost blocks its table takes again,
    is still found."""
    s = ShadowKVStore(num_blocks=8, block_size=4)
    s.assign([1, 2], "a")
    s.write("a", [1, 2], 0, 8, now=0.0)
    s.assign([1, 2], "b")  # a preempted: its blocks go to b
    table = [3]
    s.assign(table, "a")  # a resumes with a new table
    s.write("a", table, 0, 4, now=1.0)
    assert s.read("a", table, 4, now=1.1)
    assert s._disjoint["a"] == (table, 1)  # (block 3 tested once, clear of {1, 2})
    s.assign([4], "a")
    table.append(4)
    s.write("a", table, 4, 8, now=1.2)
    assert s.read("a", table, 8, now=1.3)
    s.assign([3], "c")  # a loses block 3 too, now in the tested part of its table
    assert not s.read("a", table, 8, now=1.4)
    assert s.violations[-1].kind == "read_foreign" and s.violations[-1].block_id == 3
    assert not s.read("a", table, 8, now=1.5)  # found again at every read, as before
    assert s.num_read_foreign == 2


def test_swap_snapshot_and_restore_round_trip():
    s = ShadowKVStore(num_blocks=8, block_size=4)
    s.assign([3], "a")
    s.write("a", [3], 0, 4, now=0.0)
    saved = s.snapshot_block(3)
    s.assign([5], "a")
    s.restore_block(5, saved)
    assert s.read("a", [5], 4, now=1.0)


def test_a_retired_request_is_no_longer_tracked_when_its_blocks_move_on():
    s = ShadowKVStore(num_blocks=8, block_size=4)
    s.assign([1, 2], "a")
    s.write("a", [1, 2], 0, 8, now=0.0)
    s.assign([1], "b")  # a finished, but a step in flight may still read block 1 through a's table
    assert s._bad == {"a": {1}}
    s.retire("a")  # no step can read for a any more
    s.assign([2], "c")
    assert s._bad == {}  # neither block 1 (dropped) nor block 2 (never marked) is kept for a
    s.write("c", [2], 0, 4, now=1.0)
    assert s.read("c", [2], 4, now=2.0) and s.num_corruptions == 0


def _full_state(s: ShadowKVStore) -> tuple:
    s.settle_all()
    kept = [(v.kind, v.time, v.block_id, v.request_id, v.owner, v.position) for v in s.violations]
    verified = {r: (tuple(t), n) for r, (t, n) in s._verified.items()}
    return (s.summary(), s._bad, kept, s.owner, s.owned, s.foreign, s.base, s.slots, s.content, verified)


@pytest.mark.parametrize("seed", range(40))
def test_deferred_decodes_end_where_decodes_one_by_one_end(seed: int) -> None:
    """Steady decode bursts (`decode_later`) interleaved with what can break a
    chain — a stale write into a block, a block taken over, a read through an
    old table, a forget — against the same operations with `decode`."""
    rng = random.Random(seed)
    bs, num_blocks = 8, 24
    eager, lazy = ShadowKVStore(num_blocks, bs), ShadowKVStore(num_blocks, bs)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables: dict[str, list[int]] = {}
    pos: dict[str, int] = {}
    old_tables: list[tuple[str, list[int]]] = []
    now = 0.0

    def both(method: str, *args) -> None:
        getattr(eager, method)(*args)
        getattr(lazy, method)(*args)

    for i in range(4):  # requests with a prompt written and a block table
        rid = f"r{i}"
        tables[rid] = [free.pop() for _ in range(2)]
        both("assign", list(tables[rid]), rid)
        pos[rid] = rng.randint(1, 2 * bs - 1)
        both("write", rid, tables[rid], 0, pos[rid], now)
    for step in range(200):
        now += 0.01
        op = rng.random()
        ending = rng.choice(sorted(tables)) if op >= 0.97 else max(tables, key=lambda r: len(tables[r]))
        if op < 0.9:  # one steady step for every request, n tokens each
            n = rng.choice([1, 1, 1, 3])
            for rid, table in tables.items():
                while pos[rid] + n > len(table) * bs:
                    block = free.pop() if free else rng.randrange(num_blocks)
                    table.append(block)
                    both("assign", [block], rid)
                eager.decode(rid, table, pos[rid], n, now, now + 0.001)
                lazy.decode_later(rid, table, pos[rid], n, now, now + 0.001)
                pos[rid] += n
        elif op < 0.92:  # a stale write from an old table lands on a block that moved on
            if old_tables:
                rid, table = rng.choice(old_tables)
                both("write", rid, table, 0, min(len(table) * bs, rng.randint(1, 2 * bs)), now)
        elif op < 0.94:  # a block taken over by another request (the old table stays around)
            victim = rng.choice(sorted(tables))
            old_tables.append((victim, list(tables[victim])))
            block = rng.choice(tables[victim])
            both("assign", [block], f"x{step}")
            both("write", f"x{step}", [block], 0, rng.randint(1, bs), now)
        elif op < 0.97:
            rid = rng.choice(sorted(tables))
            assert eager.read(rid, tables[rid], pos[rid], now) == lazy.read(rid, tables[rid], pos[rid], now)
        if op >= 0.97 or len(tables[ending]) >= 4:  # a request finishes; its blocks go back, a new one starts
            both("forget", ending)
            old_tables.append((ending, tables[ending]))
            free[:0] = tables.pop(ending)
            new = f"n{step}"
            tables[new] = [free.pop() if free else rng.randrange(num_blocks) for _ in range(2)]
            both("assign", list(tables[new]), new)
            pos[new] = rng.randint(1, 2 * bs - 1)
            both("write", new, tables[new], 0, pos[new], now)
        assert eager.num_corruptions == lazy.num_corruptions, step  # clean steps report nothing, deferred or not
        if rng.random() < 0.2:
            assert _full_state(eager) == _full_state(lazy), step
    assert _full_state(eager) == _full_state(lazy)
