"""What the load driver and the proxy tell each other in the Ray runtime,
typed (they cross Ray as pickles of these NamedTuples):

    driver -> proxy: Submission, one per released request
    proxy -> driver: Arrived, Scheduled, KVEvent (from the decode node),
                     Tokens, Finished — times are run seconds stamped by the proxy
"""

from __future__ import annotations

from typing import NamedTuple

from node.messages import KVEvent


class Submission(NamedTuple):
    request_id: str
    prompt_len: int
    output_len: int
    priority: int = 0
    prompt_segments: tuple[tuple[int, int], ...] = ()
    # Sampling a client asked for (`bench/serve/`); ignore_eos None: the cluster's sampler setting.
    ignore_eos: bool | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()


class Arrived(NamedTuple):
    request_id: str
    time: float


class Scheduled(NamedTuple):
    """First scheduled at a node (the node's clock)."""

    request_id: str
    time: float


class Tokens(NamedTuple):
    request_id: str
    token_ids: list[int]
    time: float


class Finished(NamedTuple):
    request_id: str
    reason: str
    time: float
    num_preemptions: int
    node: str  # where the request was when it finished ("" if nowhere)


ClientEvent = Arrived | Scheduled | KVEvent | Tokens | Finished
