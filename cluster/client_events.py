"""What the load driver and the proxy tell each other in the Ray runtime,
typed (they cross Ray as pickles of these NamedTuples):

    driver -> proxy: Submission, one per released request
    proxy -> driver: Arrived, Scheduled, KVEvent (from the decode node),
                     Tokens, Finished — times are run seconds stamped by the proxy
"""

from __future__ import annotations

from typing import NamedTuple

from engine.records import RequestRecord
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


def apply_to_record(rec: RequestRecord, ev: ClientEvent) -> bool:
    """One client event (other than `Arrived`, which makes or dates the
    record) written into its request's record, as the client sees it; True
    when it finished the request. A finished record takes nothing more."""
    if rec.finish_reason is not None:
        return False
    if isinstance(ev, Tokens):
        rec.output_token_ids.extend(ev.token_ids)
        rec.token_times.extend([ev.time] * len(ev.token_ids))
    elif isinstance(ev, Scheduled):
        if rec.first_scheduled_time is None:
            rec.first_scheduled_time = ev.time
    elif isinstance(ev, KVEvent):
        if ev.phase == "start":
            rec.remote_kv_wait_start = ev.time
        else:
            rec.remote_kv_wait_end = ev.time
    elif isinstance(ev, Finished):
        rec.finish_reason, rec.finish_time, rec.num_preemptions = ev.reason, ev.time, ev.num_preemptions
        return True
    return False
