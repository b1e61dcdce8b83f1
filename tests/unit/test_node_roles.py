"""The node roles driven by hand on the virtual clock, with a scripted KV
transport: the one fault policy (retries, per-attempt timeouts, deadline,
only the missing blocks re-pulled, final failures, concurrency cap, done
reports) and the producer's hold timeout — no Ray, gRPC or sockets."""

from __future__ import annotations

import pytest

from cluster.inproc.clock import EventLoop
from cluster.inproc.executor import VirtualPipelineExecutor
from connector.pull_policy import KVFaultPolicy
from connector.transport import DoneReportResult, PullAttemptResult, PullFailure
from decode_node.node import DecodeNode
from engine.config import CacheConfig
from engine.cost_model import get_cost_model
from engine.node_core import NodeSpec
from node.messages import KVEvent, OutputEvent, RequestMessage
from node.ports import NodePorts
from node.settings import NodeSettings
from prefill_node.node import PrefillNode

POLICY = KVFaultPolicy(
    attempt_timeout_s=0.3,
    deadline_s=2.0,
    backoff_initial_s=0.05,
    backoff_max_s=0.2,
    hold_timeout_s=5.0,
    max_concurrent_pulls=8,
)


class ScriptedKV:
    """Answers attempt k of every pull with `script[k]` (the last one repeats):
    a failure after the attempt's timeout, or blocks landing after 10 ms."""

    def __init__(self, loop: EventLoop, script: list, deliver_reports: bool = True) -> None:
        self.loop = loop
        self.script = script
        self.deliver_reports = deliver_reports
        self.attempts: list = []
        self.reports: list = []

    def pull(self, attempt, on_block, on_result):
        self.attempts.append((self.loop.now(), attempt))
        what = self.script[min(attempt.number, len(self.script)) - 1]
        if isinstance(what, PullFailure):
            at = self.loop.now() + (attempt.timeout_s if what is PullFailure.DEADLINE_EXCEEDED else 0.01)
            self.loop.at(at, on_result, PullAttemptResult(attempt, failure=what, reason=what.value))
        else:  # the number of blocks that land; the rest of the attempt is lost
            landed = attempt.block_indices[:what]
            failure = None if len(landed) == len(attempt.block_indices) else PullFailure.PROTOCOL_ERROR
            self.loop.at(self.loop.now() + 0.01, on_result, PullAttemptResult(attempt, landed, failure))

    def report_done(self, report, on_result):
        self.reports.append(report)
        self.loop.at(self.loop.now() + 0.01, on_result, DoneReportResult(report, delivered=self.deliver_reports))


def decode_node(loop, kv, policy=POLICY, failure_policy="recompute"):
    spec = NodeSpec("decode-0", "kv_consumer", cache=CacheConfig(200, 16), kv_load_failure_policy=failure_policy)
    events: list = []
    ports = NodePorts(loop, VirtualPipelineExecutor(loop, 1), events.extend)
    node = DecodeNode(spec, NodeSettings(get_cost_model("unit"), kv_policy=policy), ports, kv)
    return node, events


def handed_off(rid, prompt_len=40, max_tokens=4):
    params = {
        "do_remote_prefill": True,
        "remote_block_ids": [7, 8, 9][: -(-prompt_len // 16)],
        "remote_request_id": rid,
        "remote_engine_id": "prefill-0",
        "remote_address": "prefill-0",
    }
    return RequestMessage(rid, prompt_len, max_tokens, 0.0, kv_transfer_params=params)


def finishes(events):
    return {e.request_id: e.finish_reason for e in events if isinstance(e, OutputEvent) and e.finish_reason}


def test_a_timed_out_attempt_is_retried_after_the_backoff_and_the_pull_lands():
    loop = EventLoop()
    kv = ScriptedKV(loop, [PullFailure.DEADLINE_EXCEEDED, 3])
    node, events = decode_node(loop, kv)
    node.on_requests([handed_off("a")])
    loop.run()
    (t1, a1), (t2, a2) = kv.attempts
    assert (a1.number, a2.number) == (1, 2) and a1.timeout_s == 0.3
    assert t2 - t1 == 0.3 + 0.05  # the attempt's timeout, then the first backoff
    c = node.counters()
    assert (c["kv_pull_attempts"], c["transport_retries"], c["kv_pulls_completed"], c["kv_blocks_pulled"]) == (
        2,
        1,
        1,
        3,
    )
    assert [(e.phase, e.ok) for e in events if isinstance(e, KVEvent)] == [("start", True), ("end", True)]
    assert finishes(events) == {"a": "length"}
    assert [r.success for r in kv.reports] == [True] and c["kv_done_reports_delivered"] == 1
    assert node.report().invariant_errors == []


def test_a_retry_asks_only_for_the_blocks_still_missing():
    loop = EventLoop()
    kv = ScriptedKV(loop, [2, 1])  # two of three blocks land, then the last one
    node, events = decode_node(loop, kv)
    node.on_requests([handed_off("a")])
    loop.run()
    (_, a1), (t2, a2) = kv.attempts
    assert a1.block_indices == (0, 1, 2) and a2.block_indices == (2,) and a2.remote_block_ids == (9,)
    assert t2 == 0.01 + 0.05  # progress resets the backoff
    assert node.counters()["kv_blocks_pulled"] == 3 and finishes(events) == {"a": "length"}


def test_a_final_failure_ends_the_pull_at_once_and_the_load_failure_policy_decides():
    for failure_policy, reason in (("recompute", "length"), ("fail", "error")):
        loop = EventLoop()
        kv = ScriptedKV(loop, [PullFailure.UNKNOWN_REQUEST])
        node, events = decode_node(loop, kv, failure_policy=failure_policy)
        node.on_requests([handed_off("a")])
        loop.run()
        c = node.counters()
        assert (c["kv_pull_attempts"], c["kv_pulls_failed"], c["kv_pulls_failed_unknown_request"]) == (1, 1, 1)
        assert finishes(events) == {"a": reason}
        assert [r.success for r in kv.reports] == [False]  # the producer is told, once
        assert node.report().invariant_errors == []


def test_retries_stop_at_the_deadline():
    loop = EventLoop()
    kv = ScriptedKV(loop, [PullFailure.PRODUCER_UNAVAILABLE])  # answers at once, every time
    node, events = decode_node(loop, kv)
    node.on_requests([handed_off("a")])
    loop.run()
    times = [t for t, _ in kv.attempts]
    gaps = [round(b - a, 6) for a, b in zip(times, times[1:])]
    assert gaps[:4] == [0.06, 0.11, 0.21, 0.21]  # 10 ms answer + backoff 0.05, 0.1, 0.2 (capped), ...
    assert times[-1] < 2.0 and node.counters()["kv_pulls_failed_producer_unavailable"] == 1
    assert finishes(events) == {"a": "length"}  # recomputed


def test_pulls_beyond_the_cap_wait_for_a_slot():
    loop = EventLoop()
    kv = ScriptedKV(loop, [PullFailure.DEADLINE_EXCEEDED, 3])
    policy = KVFaultPolicy(
        attempt_timeout_s=0.3, deadline_s=2.0, backoff_initial_s=0.05, backoff_max_s=0.2, max_concurrent_pulls=1
    )
    node, events = decode_node(loop, kv, policy)
    node.on_requests([handed_off("a"), handed_off("b")])
    loop.run()
    starts = {a.request_id: t for t, a in kv.attempts if a.number == 1}
    assert starts["b"] >= 0.3 + 0.05 + 0.01  # after "a" landed
    assert finishes(events) == {"a": "length", "b": "length"}


def producer(loop):
    spec = NodeSpec("prefill-0", "kv_producer", cache=CacheConfig(100, 16))
    events: list = []
    node = PrefillNode(
        spec,
        NodeSettings(get_cost_model("unit"), kv_policy=POLICY),
        NodePorts(loop, VirtualPipelineExecutor(loop, 1), events.extend),
    )
    node.on_requests([RequestMessage("a", 40, 1, 0.0, kv_transfer_params={"do_remote_decode": True})])
    return node, events


def test_the_producer_frees_held_blocks_when_the_consumer_reports():
    loop = EventLoop()
    node, events = producer(loop)
    loop.run(until=1.0)
    params = next(e.kv_transfer_params for e in events if isinstance(e, OutputEvent) and e.finish_reason)
    assert node.busy() and node.check_blocks("a", params["remote_block_ids"]) == 40
    node.on_done_report("a", True)
    node.on_done_report("a", True)  # a repeat: released already
    loop.run()
    c = node.counters()
    assert (c["kv_done_reports"], c["kv_late_done_reports"], c["kv_hold_timeouts"]) == (2, 1, 0)
    assert not node.busy() and node.report().invariant_errors == []
    assert loop.now() < POLICY.hold_timeout_s  # the cancelled hold timer did not move the clock


def test_a_hold_nobody_reports_on_expires():
    loop = EventLoop()
    node, _ = producer(loop)
    loop.run()
    assert node.counters()["kv_hold_timeouts"] == 1 and loop.now() >= POLICY.hold_timeout_s
    assert not node.busy() and node.report().invariant_errors == []


def test_nodes_share_the_sampler_their_runtime_gives_them_and_refuse_one_seeded_otherwise():
    from engine.sampler import DeterministicSampler

    loop = EventLoop()
    shared = DeterministicSampler(seed=7)
    spec = NodeSpec("decode-0", "kv_consumer", cache=CacheConfig(200, 16), sampler_seed=7)
    ports = NodePorts(loop, VirtualPipelineExecutor(loop, 1), [].extend, sampler=shared)
    node = DecodeNode(spec, NodeSettings(get_cost_model("unit")), ports, ScriptedKV(loop, [1]))
    assert node.core.sampler is shared and node.core.runner.sampler is shared

    other = NodeSpec("decode-1", "kv_consumer", cache=CacheConfig(200, 16), sampler_seed=8)
    with pytest.raises(ValueError, match="shared sampler has seed 7 .* spec says 8"):
        DecodeNode(other, NodeSettings(get_cost_model("unit")), ports, ScriptedKV(loop, [1]))
