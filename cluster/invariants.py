"""Invariants checked after every run, on the client's side: every request
terminal, every token delivered once, in order, with no gaps (tokens are
deterministic per position, so the client can check each one). Each node
checks its own blocks (`NodeCore.end_of_run_errors`: conserved, all
returned, no double free, nothing held or deferred)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from engine.records import RequestRecord
from engine.token_ids import TokenIds

# The sampler's token id at (request id, output position): `DeterministicSampler.token_at`.
TokenAt = Callable[[str, int], int]


def check_tokens(
    rec: RequestRecord,
    token_at: TokenAt,
    eos_token_id: int,
    max_model_len: int | None = None,
    expected: list[int] | None = None,
) -> list[str]:
    """`expected`: the sampler's ids at the record's positions, if the caller
    drew them already (`check_requests` draws them for many records at once)."""
    errors = []
    if len(rec.token_times) != len(rec.output_token_ids):
        errors.append(f"{rec.request_id}: {len(rec.output_token_ids)} tokens but {len(rec.token_times)} arrival times")
    ids = rec.output_token_ids
    if isinstance(ids, TokenIds):
        # Runs of sampler tokens are checked by their indices, not id by id.
        bad = ids.check(token_at, rec.request_id, rec.prompt_len)
        if bad is not None:
            i, tok, want = bad
            errors.append(f"{rec.request_id}: token {i} is {tok}, expected {want} (gap, duplicate or reorder)")
    elif expected is not None:
        if ids != expected:
            i = next(i for i, (tok, want) in enumerate(zip(ids, expected)) if tok != want)
            tok, want = ids[i], expected[i]
            errors.append(f"{rec.request_id}: token {i} is {tok}, expected {want} (gap, duplicate or reorder)")
    else:
        for i, tok in enumerate(ids):
            want = token_at(rec.request_id, rec.prompt_len + i)
            if tok != want:
                errors.append(f"{rec.request_id}: token {i} is {tok}, expected {want} (gap, duplicate or reorder)")
                break
    times = rec.token_times
    if times != sorted(times):  # sorted() of an ordered list is one linear pass
        errors.append(f"{rec.request_id}: tokens arrived out of order")
    # "length" also covers an ignored prompt (v0's FINISHED_IGNORED: no token)
    # and a sequence capped by max_model_len.
    capped = max_model_len is not None and rec.prompt_len + len(rec.output_token_ids) >= max_model_len
    ignored = not rec.output_token_ids
    if rec.finish_reason == "length" and len(rec.output_token_ids) != rec.max_tokens and not (capped or ignored):
        errors.append(
            f"{rec.request_id}: finished by length with {len(rec.output_token_ids)} of {rec.max_tokens} tokens"
        )
    if rec.finish_reason == "stop" and (not rec.output_token_ids or rec.output_token_ids[-1] != eos_token_id):
        errors.append(f"{rec.request_id}: finished by stop without a stop token last")
    return errors


def check_requests(
    records: Sequence[RequestRecord],
    token_at: TokenAt,
    eos_token_id: int,
    max_model_len: int | None,
    released_ids: Iterable[str],
) -> list[str]:
    """Every request terminal; every token present once, in order, no gaps;
    every request of the workload released by the load driver."""
    errors: list[str] = []
    expected = _expected_ids(records, token_at)
    for rec in records:
        if rec.finish_reason is None:
            errors.append(f"{rec.request_id}: not in a terminal state at the end of the run")
            continue
        if rec.finish_reason in ("stop", "length"):
            errors.extend(check_tokens(rec, token_at, eos_token_id, max_model_len, expected.get(rec.request_id)))
    seen = {r.request_id for r in records}
    for req_id in released_ids:
        if req_id not in seen:
            errors.append(f"{req_id}: never released by the load driver")
    return errors


# Records whose ids are drawn in one numpy pass (`token_windows`); a bound on
# the pass's arrays (records x longest output).
_WINDOW_TOKENS = 1 << 18


def _expected_ids(records: Sequence[RequestRecord], token_at: TokenAt) -> dict[str, list[int]]:
    """The sampler's ids at the positions of every record holding a plain
    list of ids (a run's or a node's that steps one by one: each id was
    sampled and sent), drawn together when `token_at` is a sampler's (the
    same arithmetic, engine/sampler.py); empty otherwise (ids drawn one by one)."""
    windows_of = getattr(getattr(token_at, "__self__", None), "token_windows", None)
    if windows_of is None:
        return {}
    todo = [
        r
        for r in records
        if r.finish_reason in ("stop", "length") and r.output_token_ids and type(r.output_token_ids) is list
    ]
    todo.sort(key=lambda r: len(r.output_token_ids))  # similar lengths share a pass: less padding
    expected: dict[str, list[int]] = {}
    i = 0
    while i < len(todo):
        j = i + 1
        while j < len(todo) and (j + 1 - i) * len(todo[j].output_token_ids) <= _WINDOW_TOKENS:
            j += 1
        chunk = todo[i:j]
        ids = windows_of([(r.request_id, r.prompt_len, len(r.output_token_ids)) for r in chunk])
        expected.update(zip((r.request_id for r in chunk), ids))
        i = j
    return expected
