"""A pickled `TokenIds` keeps its runs: it reads the same ids after the
round trip (drawn from the sampler it names), the end-of-run check still
sees a gap, the sampler goes into the pickle once however many records name
it, and a copy (shallow or deep) is still a plain list."""

import copy
import pickle

from engine.sampler import DeterministicSampler
from engine.token_ids import TokenIds


def _ids(sampler: DeterministicSampler, rid: str, runs) -> TokenIds:
    ids = TokenIds([sampler.token_at(rid, 100), sampler.token_at(rid, 101)])  # explicit first, as sampled ones arrive
    for first, n in runs:
        ids.add_run(sampler.token_at, rid, 100, first, n)
    return ids


def test_round_trip_keeps_runs_and_reads_the_same_ids():
    sampler = DeterministicSampler(seed=3)
    ids = _ids(sampler, "r1", [(2, 40), (42, 10)])
    back = pickle.loads(pickle.dumps(ids))
    assert type(back) is TokenIds and back.has_runs
    assert len(back) == len(ids) == 52
    assert back == ids and list(back) == list(ids)
    assert back[2] == sampler.token_at("r1", 102) and back[-1] == sampler.token_at("r1", 151)


def test_the_check_still_sees_a_gap_after_the_round_trip():
    sampler = DeterministicSampler(seed=3)
    gap = pickle.loads(pickle.dumps(_ids(sampler, "r1", [(2, 5), (8, 5)])))  # index 7 missing
    assert gap.check(sampler.token_at, "r1", 100)[0] == 7
    whole = pickle.loads(pickle.dumps(_ids(sampler, "r1", [(2, 5), (7, 5)])))
    assert whole.check(sampler.token_at, "r1", 100) is None
    wrong = TokenIds([1, 2])
    wrong.add_run(sampler.token_at, "r1", 100, 2, 5)
    assert pickle.loads(pickle.dumps(wrong)).check(sampler.token_at, "r1", 100)[:2] == (0, 1)  # explicit ids too


def test_the_sampler_is_pickled_once_for_many_records():
    sampler = DeterministicSampler(seed=3)
    for i in range(2000):
        sampler.token_at(f"req-{i}", 0)  # a long run's sampler knows every request
    one = len(pickle.dumps([_ids(sampler, "req-0", [(2, 50)])]))
    many = len(pickle.dumps([_ids(sampler, f"req-{i}", [(2, 50)]) for i in range(200)]))
    assert many < one + 200 * 200  # each further record adds its pieces, not another sampler


def test_copies_are_plain_lists():
    sampler = DeterministicSampler(seed=3)
    ids = _ids(sampler, "r1", [(2, 3)])
    for copied in (copy.copy(ids), copy.deepcopy(ids)):
        assert type(copied) is list and copied == list(ids)
