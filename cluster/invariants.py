"""Invariants checked after every run, on the client's side: every request
terminal, every token delivered once, in order, with no gaps (tokens are
deterministic per position, so the client can check each one). Each node
checks its own blocks (`NodeCore.end_of_run_errors`: conserved, all
returned, no double free, nothing held or deferred)."""

from __future__ import annotations

from engine.records import TokenIds


def check_tokens(rec, token_at, eos_token_id: int, max_model_len: int | None = None) -> list[str]:
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


def check_requests(records, token_at, eos_token_id: int, max_model_len: int | None, released_ids) -> list[str]:
    """Every request terminal; every token present once, in order, no gaps;
    every request of the workload released by the load driver."""
    errors: list[str] = []
    for rec in records:
        if rec.finish_reason is None:
            errors.append(f"{rec.request_id}: not in a terminal state at the end of the run")
            continue
        if rec.finish_reason in ("stop", "length"):
            errors.extend(check_tokens(rec, token_at, eos_token_id, max_model_len))
    seen = {r.request_id for r in records}
    for req_id in released_ids:
        if req_id not in seen:
            errors.append(f"{req_id}: never released by the load driver")
    return errors
