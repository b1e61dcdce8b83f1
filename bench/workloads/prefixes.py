"""Prompt content that requests share, for prefix caching: N system prompts
x M users (`shared_prefix`) and multi-turn sessions where each turn's prompt
extends the last (`sessions`). The generated lengths become each request's
own part; shared parts are segments with the same key (`engine/prompt.py`).

In a session, turn k's prompt is turn k-1's prompt, then a segment standing
for turn k-1's reply (its output length), then turn k's own message. The
reply segment is not the tokens the simulator samples for turn k-1, so a
turn hits the cache for the previous turns' prompts, not their replies
(vLLM would hit those too, when they are still cached).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from engine.prompt import segment_key
from engine.records import WorkloadRequest


class SharedPrefix(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # How many distinct system prompts, and how long each is (tokens).
    num_prefixes: int = Field(ge=1, le=100_000)
    prefix_len: int = Field(ge=1, le=1_000_000)
    # Which system prompt a request gets: request i gets prefix i % N, or one drawn at random.
    assignment: Literal["round_robin", "random"] = "random"


class Sessions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Consecutive requests form sessions of this many turns.
    turns: int = Field(ge=2, le=10_000)


def apply_prefix_structure(
    requests: list[WorkloadRequest],
    shared: SharedPrefix | None,
    sessions: Sessions | None,
    rng: np.random.Generator,
    seed: int,
) -> list[WorkloadRequest]:
    """The same requests with shared content: prompt lengths grow by the
    shared parts, `prompt_segments` say which parts are shared."""
    if shared is None and sessions is None:
        return requests
    n = len(requests)
    if shared is not None:
        if shared.assignment == "random":
            choice = rng.integers(0, shared.num_prefixes, size=n)
        else:
            choice = np.arange(n) % shared.num_prefixes
    out: list[WorkloadRequest] = []
    history: tuple[tuple[int, int], ...] = ()
    for i, r in enumerate(requests):
        turn = i % sessions.turns if sessions is not None else 0
        if turn == 0:
            history = ()
            if shared is not None:
                history = ((segment_key(f"system-prompt/{seed}/{int(choice[i])}"), shared.prefix_len),)
        own = (segment_key(f"user/{r.request_id}"), r.prompt_len)
        segments = history + (own,)
        out.append(
            WorkloadRequest(
                r.request_id,
                r.arrival_time,
                sum(length for _, length in segments),
                r.output_len,
                r.priority,
                r.hash_ids,
                segments,
            )
        )
        if sessions is not None:
            history = segments + ((segment_key(f"reply/{r.request_id}"), r.output_len),)
    return out
