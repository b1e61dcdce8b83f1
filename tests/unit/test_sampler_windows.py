"""`DeterministicSampler.tokens_at` and `token_windows` (the numpy pass the
steady paths draw a forward's block ids with, engine/steady_caching.py), and
`tokens_each` (a bulk step's tokens), give `token_at`'s ids exactly, EOS
draws included; and a steady member's block
hashes, with its newest ids not written yet, are those of its written ids."""

from __future__ import annotations

import random

import pytest

from engine.block_hash import extend_block_hashes, update_block_hashes
from engine.request import Request, SamplingParams
from engine.sampler import DeterministicSampler


@pytest.mark.parametrize("stop_probability", [0.0, 0.3, 1.0])
def test_windows_are_token_at(stop_probability: float) -> None:
    sampler = DeterministicSampler(seed=7, stop_probability=stop_probability)
    rng = random.Random(1)
    windows = [(f"r{rng.randint(0, 40)}", rng.randint(0, 1 << 20), rng.randint(1, 16)) for _ in range(400)]
    expected = [[sampler.token_at(rid, p) for p in range(first, first + n)] for rid, first, n in windows]
    assert [sampler.tokens_at(*w) for w in windows] == expected
    assert sampler.token_windows(windows) == expected
    assert sampler.token_windows([]) == []
    if stop_probability == 1.0:
        assert {t for row in expected for t in row} == {sampler.eos_token_id}


@pytest.mark.parametrize("stop_probability", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("n", [0, 1, 23, 24, 200])  # below and from the numpy batch size
def test_tokens_each_is_token_at(stop_probability: float, n: int) -> None:
    """A bulk step's draw (engine/bulk_step.py): one position per request,
    a request seen before or not (its hash computed on the way)."""
    sampler = DeterministicSampler(seed=5, stop_probability=stop_probability)
    rng = random.Random(n)
    ids = [f"r{rng.randint(0, 60)}" for _ in range(n)]
    positions = [rng.randint(0, 1 << 40) for _ in range(n)]
    for rid in ids[: n // 2]:
        sampler.token_at(rid, 0)  # some hashes cached already
    fresh = DeterministicSampler(seed=5, stop_probability=stop_probability)
    assert sampler.tokens_each(ids, positions) == [fresh.token_at(r, p) for r, p in zip(ids, positions)]


@pytest.mark.parametrize("written", [0, 5, 37])
def test_hashes_with_unwritten_outputs_are_those_of_the_written_ids(written: int) -> None:
    """Block hashes over a prompt and 60 outputs, of which only `written`
    are in the output list (some as UNSAMPLED): the same as when all 60 are."""
    sampler = DeterministicSampler(seed=3)
    prompt = [sampler.token_at("prompt", p) for p in range(21)]

    def request() -> Request:
        return Request("q", prompt, SamplingParams(max_tokens=100))

    full = request()
    full.append_output_token_ids([sampler.token_at("q", 21 + i) for i in range(60)])
    lazy = request()
    lazy.append_output_token_ids([sampler.token_at("q", 21 + i) for i in range(written // 2)])
    lazy.append_unsampled(written - written // 2, sampler.token_at)
    assert extend_block_hashes(lazy, 81 // 4, 4, sampler.tokens_at) == update_block_hashes(full, 4)
