"""The Ray runtime's plain parts, without Ray: framing, the delay line, the
proxy's routing, the consumer's sink, the producer's block source, and the
validation at the edges."""

from __future__ import annotations

import asyncio

import pytest

from cluster.ray_cluster import RayClusterHandle
from cluster.ray_proxy_router import ProxyRouter
from cluster.ray_runtime import parse_faults
from connector.link import Link, LinkSpec
from connector.payload import block_payload
from connector.transport import UnknownBlockError, UnknownRequestError
from decode_node.block_sink import BlockContentMismatch, VerifyingBlockSink
from decode_node.delay_line import DelayedMailbox
from decode_node.frames import FrameConnection, serve
from decode_node.settings import WallNodeSettings
from decode_node.wall_clock import RunClock
from engine.cost_model import get_cost_model
from engine.node_core import NodeCore, NodeSpec
from engine.request import Request, SamplingParams
from prefill_node.block_source import HeldBlockSource

from .conftest import make_spec

pytestmark = pytest.mark.timeout(30)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


# -- frames ----------------------------------------------------------------------
def test_frames_arrive_whole_and_in_order_and_eof_reads_as_none():
    async def body():
        got = []

        async def echo(conn):
            while (frame := await conn.recv()) is not None:
                got.append(frame)
                conn.send(["ack", frame[0]])

        server, port = await serve("127.0.0.1", echo)
        conn = await FrameConnection.open("127.0.0.1", port)
        for i in range(50):
            conn.send([i, {"ids": list(range(i))}, ("tuple", "becomes", "list")])
        acks = [await conn.recv() for _ in range(50)]
        await conn.close()
        server.close()
        return got, acks

    got, acks = run(body())
    assert [f[0] for f in got] == list(range(50))
    assert got[7] == [7, {"ids": list(range(7))}, ["tuple", "becomes", "list"]]
    assert acks == [["ack", i] for i in range(50)]


# -- delay line ----------------------------------------------------------------------
def test_a_delayed_mailbox_keeps_fifo_order_and_applies_the_links_delay():
    async def body():
        clock = RunClock.starting_now()
        delivered = []
        link = Link(LinkSpec(delay_ms=20, jitter_ms=10), seed=3)
        box = DelayedMailbox(clock, link.forward, lambda batch: delivered.extend((i, clock.now()) for i in batch))
        for i in range(20):
            box.put(i, 100)
        await asyncio.sleep(0.2)
        box.close()
        return delivered

    delivered = run(body())
    assert [i for i, _ in delivered] == list(range(20))
    assert all(t >= 0.0 for _, t in delivered) and delivered[0][1] > 0.0  # nothing before its delay


# -- the proxy's routing -------------------------------------------------------------
class _Harness:
    def __init__(self, prefill=("prefill-0",), decode=("decode-0",), routing="round_robin"):
        self.sent: list[tuple[str, dict]] = []
        self.events: list = []
        self.router = ProxyRouter(make_spec(routing=routing), 0, RunClock.starting_now(), list(prefill), list(decode),
                                  lambda node, wires: self.sent.extend((node, w) for w in wires), self.events.extend)

    async def settle(self):
        await asyncio.sleep(0.01)


def test_the_proxy_prefills_with_one_token_then_decodes_with_the_returned_params():
    async def body():
        h = _Harness()
        h.router.submit([("a", 40, 5, 0)])
        await h.settle()
        (node, wire), = h.sent
        assert node == "prefill-0"
        assert (wire["max_tokens"], wire["kv_transfer_params"]) == (1, {"do_remote_decode": True})
        params = {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3], "remote_address": "127.0.0.1:1"}
        h.router.node_events("prefill-0", [["out", "a", [77], "length", params, 0, 0.001]])
        await h.settle()
        node, wire = h.sent[1]
        assert node == "decode-0" and (wire["max_tokens"], wire["kv_transfer_params"]) == (5, params)
        h.router.node_events("decode-0", [["out", "a", [5, 6], None, None, 0, 0.002],
                                          ["out", "a", [7], "length", None, 2, 0.002]])
        await h.settle()
        h.router.close()
        return h

    h = run(body())
    kinds = [e[0] for e in h.events]
    assert kinds == ["arrive", "sched", "tok", "tok", "fin"]
    assert [e[2] for e in h.events if e[0] == "tok"] == [[5, 6], [7]]  # the prefill's token is not streamed
    assert h.events[-1][1:3] == ("a", "length") and h.events[-1][4] == 2
    assert h.router.outstanding == {"prefill-0": 0, "decode-0": 0}


def test_a_dead_prefill_node_fails_its_requests_and_leaves_the_router():
    async def body():
        h = _Harness(prefill=("prefill-0", "prefill-1"))
        h.router.submit([("a", 40, 5, 0), ("b", 40, 5, 0)])
        await h.settle()
        h.router.node_died("prefill-0")
        h.router.submit([("c", 40, 5, 0)])
        await h.settle()
        h.router.close()
        return h

    h = run(body())
    assert [(n, w["request_id"]) for n, w in h.sent] == [("prefill-0", "a"), ("prefill-1", "b"), ("prefill-1", "c")]
    fins = [e for e in h.events if e[0] == "fin"]
    assert [(e[1], e[2]) for e in fins] == [("a", "error")]


def test_least_loaded_routing_picks_the_node_with_fewest_outstanding_requests():
    async def body():
        h = _Harness(prefill=(), decode=("decode-0", "decode-1"), routing="least_loaded")
        h.router.submit([("a", 8, 50, 0), ("b", 8, 50, 0)])
        h.router.node_events("decode-0", [["out", "a", [1], "length", None, 0, 0.0]])
        await h.settle()
        h.router.submit([("c", 8, 50, 0), ("d", 8, 50, 0)])
        await h.settle()
        h.router.close()
        return h

    h = run(body())
    # Without prefill nodes requests go straight to decode with their full
    # length; "a" finished, so "c" goes where it was; a tie goes to the first node.
    assert [(n, w["request_id"], w["max_tokens"]) for n, w in h.sent] == [
        ("decode-0", "a", 50), ("decode-1", "b", 50), ("decode-0", "c", 50), ("decode-0", "d", 50)]


def test_a_first_token_that_is_eos_ends_the_request_at_the_prefill_node():
    async def body():
        h = _Harness()
        h.router.submit([("a", 40, 5, 0)])
        await h.settle()
        h.router.node_events("prefill-0", [["out", "a", [2], "stop", None, 0, 0.0]])
        await h.settle()
        h.router.close()
        return h

    h = run(body())
    assert [e[0] for e in h.events] == ["arrive", "sched", "tok", "fin"]
    assert h.events[2][2] == [2] and h.events[3][2] == "stop"
    assert len(h.sent) == 1


# -- the consumer's sink ---------------------------------------------------------------
def test_the_sink_verifies_each_block_and_reports_the_landing_once():
    landed = []
    sink = VerifyingBlockSink(16, 64, landed.append)
    sink.expect("r", 40)  # 3 blocks: 16 + 16 + 8 tokens
    sink.write_block(10, "r", 2, block_payload("r", 2, 8, 64))
    sink.write_block(11, "r", 0, block_payload("r", 0, 16, 64))
    assert landed == []
    sink.write_block(12, "r", 1, block_payload("r", 1, 16, 64))
    assert landed == ["r"] and sink.blocks_verified == 3
    sink.expect("s", 16)
    with pytest.raises(BlockContentMismatch):
        sink.write_block(13, "s", 0, block_payload("other", 0, 16, 64))
    with pytest.raises(BlockContentMismatch):
        sink.write_block(14, "unknown", 0, b"x")
    assert sink.mismatches == 2 and landed == ["r"]


# -- the producer's block source ---------------------------------------------------------
def _producer_with_a_held_prompt(prompt_len=40):
    spec = make_spec()
    _, ns, _ = spec.node_specs()[0]
    core = NodeCore(ns)
    core.engine.add_request(Request("r", range(prompt_len), SamplingParams(max_tokens=1), eos_token_id=2,
                                    kv_transfer_params={"do_remote_decode": True}))
    outputs = []
    while (plan := core.engine.schedule_step(0.0)) is not None:
        outputs += core.engine.process_oldest(core.runner.finish_step(plan, 0.0))
    assert outputs[-1].finish_reason == "length"
    return core, outputs[-1].kv_transfer_params["remote_block_ids"]


def test_the_block_source_serves_held_blocks_and_refuses_anything_else():
    core, held = _producer_with_a_held_prompt(40)
    source = HeldBlockSource(core, 64, lambda: 0.0)
    blocks = source.get_blocks("r", [held[2], held[0]])
    assert blocks == [block_payload("r", 2, 8, 64), block_payload("r", 0, 16, 64)]
    assert (source.blocks_served, source.reads_failed) == (2, 0)
    with pytest.raises(UnknownRequestError):
        source.get_blocks("nobody", [held[0]])
    with pytest.raises(UnknownBlockError):
        source.get_blocks("r", [max(held) + 1])


# -- validation at the edges ---------------------------------------------------------------
def test_faults_name_a_node_and_a_time():
    spec = make_spec()
    assert parse_faults([{"kill": "prefill-0", "at": 1}], spec) == [("prefill-0", 1.0)]
    with pytest.raises(ValueError, match="unknown; allowed: prefill-0, decode-0"):
        parse_faults([{"kill": "prefill-9", "at": 1}], spec)
    with pytest.raises(ValueError, match="run seconds >= 0"):
        parse_faults([{"kill": "decode-0", "at": -1}], spec)
    with pytest.raises(ValueError, match="allowed: {'kill'"):
        parse_faults([{"node": "decode-0", "at_s": 1}], spec)


def test_settings_and_handle_reject_bad_values_with_the_allowed_range():
    with pytest.raises(ValueError, match="time_scale=0 is invalid; allowed: a number > 0"):
        WallNodeSettings(cost_model=get_cost_model("unit"), time_scale=0)
    with pytest.raises(ValueError, match="max_concurrent_pulls=0 is invalid"):
        WallNodeSettings(cost_model=get_cost_model("unit"), max_concurrent_pulls=0)
    with pytest.raises(ValueError, match="address=''"):
        RayClusterHandle(address="")
    with pytest.raises(ValueError, match="object_store_memory"):
        RayClusterHandle(object_store_memory=1 << 20)
