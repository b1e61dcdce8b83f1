"""The end-of-run token check draws a run's plain lists of ids in numpy
passes (`cluster.invariants._expected_ids`): it must report exactly what
drawing them one by one reports, on good and corrupted records."""

from __future__ import annotations

import random

import pytest

from cluster.invariants import _WINDOW_TOKENS, check_requests
from engine.records import RequestRecord
from engine.sampler import DeterministicSampler
from engine.token_ids import TokenIds


def _record(sampler: DeterministicSampler, rid: str, prompt_len: int, n: int, reason: str = "length") -> RequestRecord:
    rec = RequestRecord(rid, arrival_time=0.0, prompt_len=prompt_len, max_tokens=n)
    rec.output_token_ids = [sampler.token_at(rid, prompt_len + i) for i in range(n)]
    rec.token_times = [float(i) for i in range(n)]
    rec.finish_reason = reason
    return rec


def _one_by_one(sampler: DeterministicSampler):
    """The sampler's `token_at`, but not as a bound method of a sampler: the
    check then draws every id by itself."""
    return lambda rid, pos: sampler.token_at(rid, pos)


@pytest.mark.parametrize("stop_probability", [0.0, 0.01])
def test_same_errors_as_one_by_one(stop_probability: float) -> None:
    sampler = DeterministicSampler(seed=3, stop_probability=stop_probability)
    rng = random.Random(7)
    records = []
    for k in range(300):
        rec = _record(sampler, f"r{k}", rng.randint(1, 3000), rng.randint(0, 400))
        kind = rng.random()
        ids = rec.output_token_ids
        if ids and kind < 0.15:
            ids[rng.randrange(len(ids))] += 1  # a wrong id
        elif len(ids) > 1 and kind < 0.3:
            del ids[rng.randrange(len(ids))]  # a gap
            rec.token_times.pop()
        elif ids and kind < 0.4:
            ids.append(ids[-1])  # a duplicate, and a count mismatch
        records.append(rec)
    records.append(_record(sampler, "unfinished", 10, 5, reason=None))  # type: ignore[arg-type]
    batched = check_requests(records, sampler.token_at, sampler.eos_token_id, None, [r.request_id for r in records])
    plain = check_requests(records, _one_by_one(sampler), sampler.eos_token_id, None, [r.request_id for r in records])
    assert batched == plain
    assert sum("expected" in e for e in batched) >= 60  # the corruptions are found


def test_records_longer_than_a_pass_and_token_id_runs() -> None:
    """A record longer than one pass's bound is drawn alone; a `TokenIds`
    record is checked by its runs, not drawn here."""
    sampler = DeterministicSampler(seed=1)
    long = _record(sampler, "long", 5, _WINDOW_TOKENS + 3)
    short = _record(sampler, "short", 7, 4)
    short.output_token_ids[2] = 99
    runs = _record(sampler, "runs", 9, 0)
    runs.output_token_ids = TokenIds([])
    runs.output_token_ids.add_run(sampler.token_at, "runs", 9, 0, 6)
    runs.token_times = [0.0] * 6
    runs.max_tokens = 6
    errors = check_requests([long, short, runs], sampler.token_at, sampler.eos_token_id, None, [])
    want = sampler.token_at("short", 9)
    assert errors == [f"short: token 2 is 99, expected {want} (gap, duplicate or reorder)"]
