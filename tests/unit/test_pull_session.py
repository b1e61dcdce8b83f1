"""A KV load's attempts (connector/pull_policy.py `PullSession`): the first
attempt asks for every block, a retry only for the blocks still missing (in
prompt positions past a local prefix-cache hit), and the load has landed when
every block has, whichever attempt brought it."""

from __future__ import annotations

from connector.pull_policy import KVFaultPolicy, Landed, PullSession, Retry
from connector.transport import PullAttemptResult, PullFailure
from engine.kv_connector.pd_connector import RecvSpec


def _session(first_block_index: int = 0) -> PullSession:
    spec = RecvSpec("r", [10, 11, 12, 13], [20, 21, 22, 23], "r@p", "p", "prefill-0", 60, first_block_index)
    return PullSession(spec, KVFaultPolicy(), started=0.0, consumer_id="decode-0", ticket="t")


def test_a_first_attempt_asks_for_every_block_and_one_full_landing_ends_the_load():
    session = _session(first_block_index=2)
    attempt = session.next_attempt(0.0)
    assert attempt.remote_block_ids == (20, 21, 22, 23)
    assert attempt.local_block_ids == (10, 11, 12, 13)
    assert attempt.block_indices == (2, 3, 4, 5)
    assert (attempt.number, attempt.ticket, attempt.consumer_id) == (1, "t", "decode-0")
    assert session.record(PullAttemptResult(attempt, landed=(2, 3, 4, 5), num_bytes=99), 0.1) == Landed()
    assert session.missing == [] and session.num_bytes == 99


def test_a_retry_asks_only_for_the_blocks_still_missing():
    session = _session(first_block_index=1)
    first = session.next_attempt(0.0)
    partial = PullAttemptResult(first, landed=(1, 3), failure=PullFailure.DEADLINE_EXCEEDED, reason="slow")
    decision = session.record(partial, 0.5)
    assert isinstance(decision, Retry) and decision.at > 0.5
    assert session.missing == [1, 3]
    retry = session.next_attempt(decision.at)
    assert retry.remote_block_ids == (21, 23)
    assert retry.local_block_ids == (11, 13)
    assert retry.block_indices == (2, 4)
    assert retry.number == 2
    # Landing more than is missing (a block sent twice) still ends the load.
    assert session.record(PullAttemptResult(retry, landed=(1, 2, 4)), decision.at + 0.1) == Landed()
    assert session.missing == []
