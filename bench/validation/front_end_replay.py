"""The API server (engine/front_end.py) applied to a finished in-process run,
until the proxy calls it (issue 32, phase 2).

The run gives, per request, when the engine emitted each batch of its tokens
relative to when the engine got the request. The replay puts the client in
front: each request reaches the API server at its client time (the workload's
arrival, or, in a closed loop of `max_concurrency`, when the client saw the
last token of an earlier one), is parsed and tokenized in turn
(`FrontEnd.request_ready_at`), reaches the engine, and each batch of tokens
the engine emits then is streamed in turn (`FrontEnd.tokens_visible_at`).
Every call is made in time order, as the proxy would make them.

The engine's own timeline is the run's: requests that reach the engine later
than in the run keep their engine-side latencies (a shift, not a re-run). For
all-at-once and closed-loop runs that is what changes little: the engine sees
the same batch sizes, started later (docs/validation.md, "The front end").
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from engine.front_end import FrontEnd, FrontEndParams
from engine.records import RequestRecord, WorkloadRequest


@dataclass(frozen=True)
class Emissions:
    """One request's engine-side timeline: (seconds after the engine got it, tokens) per emitted batch."""

    request_id: str
    prompt_len: int
    chunks: tuple[tuple[float, int], ...]


def emissions_of(record: RequestRecord) -> Emissions | None:
    """The run's tokens of one succeeded request, grouped by emission time."""
    if not record.succeeded:
        return None
    chunks: list[list] = []
    for t in record.token_times:
        offset = t - record.arrival_time
        if chunks and chunks[-1][0] == offset:
            chunks[-1][1] += 1
        else:
            chunks.append([offset, 1])
    return Emissions(record.request_id, record.prompt_len, tuple((o, n) for o, n in chunks))


def replay(
    workload: Sequence[WorkloadRequest],
    emissions: dict[str, Emissions],
    params: FrontEndParams,
    max_concurrency: int | None,
    servers: int = 1,
) -> list[RequestRecord]:
    """Client-side records: arrival at the client, tokens when the client sees them. `servers`: the API
    servers, one per engine replica (each `vllm serve` runs its own); the round-robin router sends the
    i-th request of the workload to replica i mod servers, as the run's router did."""
    if servers < 1:
        raise ValueError(f"servers={servers!r} is invalid; allowed: an int >= 1 (one API server per replica)")
    fes = [FrontEnd(params) for _ in range(servers)]
    server_of = {w.request_id: fes[i % servers] for i, w in enumerate(workload)}
    order = [w for w in workload if w.request_id in emissions]
    events: list[tuple[float, int, str, str, int]] = []  # (time, seq, kind, request id, chunk index)
    seq = 0

    def push(t: float, kind: str, rid: str, i: int = 0) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, rid, i))
        seq += 1

    waiting = list(reversed(order))  # closed loop: the next request to send is waiting[-1]
    if max_concurrency is None:
        for w in order:
            push(w.arrival_time, "arrive", w.request_id)
        waiting = []
    else:
        for _ in range(min(max_concurrency, len(waiting))):
            w = waiting.pop()
            push(w.arrival_time, "arrive", w.request_id)
    records: dict[str, RequestRecord] = {}
    ready: dict[str, float] = {}
    by_id = {w.request_id: w for w in order}
    while events:
        t, _, kind, rid, i = heapq.heappop(events)
        em = emissions[rid]
        fe = server_of[rid]
        if kind == "arrive":
            w = by_id[rid]
            records[rid] = RequestRecord(rid, t, w.prompt_len, w.output_len)
            ready[rid] = fe.request_ready_at(t, em.prompt_len)
            push(ready[rid] + em.chunks[0][0], "tokens", rid, 0)
            continue
        offset, n = em.chunks[i]
        seen = fe.tokens_visible_at(t, n)
        rec = records[rid]
        rec.token_times.extend([seen] * n)
        if i + 1 < len(em.chunks):
            push(ready[rid] + em.chunks[i + 1][0], "tokens", rid, i + 1)
            continue
        rec.finish_time, rec.finish_reason = seen, "length"
        if waiting:
            nxt = waiting.pop()
            push(max(seen, nxt.arrival_time), "arrive", nxt.request_id)
    return [records[w.request_id] for w in order if w.request_id in records]
