"""The Ray runtime's plain parts, without Ray: framing, the delay line, the
proxy role on wall-clock links, the consumer's sink, the producer's block source, and the
validation at the edges."""

from __future__ import annotations

import asyncio

import pytest

from cluster.ray.cluster import RayClusterHandle
from cluster.ray.faults import parse_faults, split_faults
from cluster.spec import ClusterSpec
from cluster.wall.clock import RunClock
from cluster.wall.delay_line import DelayedMailbox
from cluster.wall.frames import FrameConnection, serve
from cluster.wall.proxy_links import wall_proxy
from connector.link import Link, LinkSpec
from node.messages import RequestMessage
from proxy.client import Arrived, Breakdown, Finished, Scheduled, Submission, Tokens

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
        self.sent: list[tuple[str, RequestMessage]] = []
        self.events: list = []
        # The API server off: messages go out in the next loop pass (these tests settle for 10 ms).
        spec = make_spec(routing=routing, front_end={"preset": "off"})
        self.proxy, self.links = wall_proxy(
            spec.proxy_settings(list(prefill), list(decode)),
            spec.links.proxy.to_spec(),
            0,
            RunClock.starting_now(),
            lambda node, messages: self.sent.extend((node, m) for m in messages),
            self.events.extend,
        )

    async def settle(self):
        await asyncio.sleep(0.01)


def test_the_proxy_prefills_with_one_token_then_decodes_with_the_returned_params():
    async def body():
        h = _Harness()
        h.proxy.submit([Submission("a", 40, 5, 0)])
        await h.settle()
        ((node, wire),) = h.sent
        assert node == "prefill-0"
        assert (wire.max_tokens, wire.kv_transfer_params) == (1, {"do_remote_decode": True})
        params = {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3], "remote_address": "127.0.0.1:1"}
        h.links.node_events("prefill-0", [["out", "a", [77], "length", params, 0, 0.001]])
        await h.settle()
        node, wire = h.sent[1]
        assert node == "decode-0" and (wire.max_tokens, wire.kv_transfer_params) == (5, params)
        h.links.node_events(
            "decode-0", [["out", "a", [5, 6], None, None, 0, 0.002], ["out", "a", [7], "length", None, 2, 0.002]]
        )
        await h.settle()
        h.links.close()
        return h

    h = run(body())
    kinds = [type(e) for e in h.events]
    # The first token brings the request's TTFT in parts with it.
    assert kinds == [Arrived, Scheduled, Breakdown, Tokens, Tokens, Finished]
    (parts,) = [e.parts for e in h.events if isinstance(e, Breakdown)]
    first_token = next(e.time for e in h.events if isinstance(e, Tokens))
    assert sum(parts.values()) == pytest.approx(first_token - h.events[0].time, abs=1e-9)
    assert [e.token_ids for e in h.events if isinstance(e, Tokens)] == [
        [5, 6],
        [7],
    ]  # the prefill's token is not streamed
    assert (h.events[-1].request_id, h.events[-1].reason, h.events[-1].num_preemptions) == ("a", "length", 2)
    assert h.proxy.outstanding == {"prefill-0": 0, "decode-0": 0}


def test_a_dead_prefill_node_fails_its_requests_and_leaves_the_router():
    async def body():
        h = _Harness(prefill=("prefill-0", "prefill-1"))
        h.proxy.submit([Submission("a", 40, 5, 0), Submission("b", 40, 5, 0)])
        await h.settle()
        h.proxy.node_died("prefill-0")
        h.proxy.submit([Submission("c", 40, 5, 0)])
        await h.settle()
        h.links.close()
        return h

    h = run(body())
    assert [(n, w.request_id) for n, w in h.sent] == [("prefill-0", "a"), ("prefill-1", "b"), ("prefill-1", "c")]
    fins = [e for e in h.events if isinstance(e, Finished)]
    assert [(e.request_id, e.reason) for e in fins] == [("a", "error")]


def test_least_loaded_routing_picks_the_node_with_fewest_outstanding_requests():
    async def body():
        h = _Harness(prefill=(), decode=("decode-0", "decode-1"), routing="least_loaded")
        h.proxy.submit([Submission("a", 8, 50, 0), Submission("b", 8, 50, 0)])
        h.links.node_events("decode-0", [["out", "a", [1], "length", None, 0, 0.0]])
        await h.settle()
        h.proxy.submit([Submission("c", 8, 50, 0), Submission("d", 8, 50, 0)])
        await h.settle()
        h.links.close()
        return h

    h = run(body())
    # Without prefill nodes requests go straight to decode with their full
    # length; "a" finished, so "c" goes where it was; a tie goes to the first node.
    assert [(n, w.request_id, w.max_tokens) for n, w in h.sent] == [
        ("decode-0", "a", 50),
        ("decode-1", "b", 50),
        ("decode-0", "c", 50),
        ("decode-0", "d", 50),
    ]


def test_a_first_token_that_is_eos_ends_the_request_at_the_prefill_node():
    async def body():
        h = _Harness()
        h.proxy.submit([Submission("a", 40, 5, 0)])
        await h.settle()
        h.links.node_events("prefill-0", [["out", "a", [2], "stop", None, 0, 0.0]])
        await h.settle()
        h.links.close()
        return h

    h = run(body())
    assert [type(e) for e in h.events] == [Arrived, Scheduled, Breakdown, Tokens, Finished]
    assert h.events[3].token_ids == [2] and h.events[4].reason == "stop"
    assert len(h.sent) == 1


# -- validation at the edges ---------------------------------------------------------------
def test_faults_name_a_node_and_a_time():
    spec = make_spec()
    assert parse_faults([{"kill": "prefill-0", "at": 1}], spec) == [("prefill-0", 1.0)]
    with pytest.raises(ValueError, match="unknown; allowed: prefill-0, decode-0"):
        parse_faults([{"kill": "prefill-9", "at": 1}], spec)
    with pytest.raises(ValueError, match="run seconds >= 0"):
        parse_faults([{"kill": "decode-0", "at": -1}], spec)
    with pytest.raises(ValueError, match="allowed: {'kill' or 'restart'"):
        parse_faults([{"node": "decode-0", "at_s": 1}], spec)


def test_a_restart_follows_a_kill_of_the_same_node():
    spec = make_spec()
    kill, restart = {"kill": "decode-0", "at": 1}, {"restart": "decode-0", "at": 2.5}
    assert split_faults([kill, restart], spec) == ([("decode-0", 1.0)], [("decode-0", 2.5)])
    with pytest.raises(ValueError, match="restart of decode-0 at 2.5 s follows no kill of it"):
        split_faults([restart], spec)
    with pytest.raises(ValueError, match="follows no kill"):
        split_faults([{"kill": "decode-0", "at": 3}, restart], spec)


def test_settings_and_handle_reject_bad_values_with_the_allowed_range():
    with pytest.raises(ValueError, match=r"time_scale\n  Input should be greater than or equal to 0.0001"):
        ClusterSpec(time_scale=0)
    with pytest.raises(ValueError, match="address=''"):
        RayClusterHandle(address="")
    with pytest.raises(ValueError, match="object_store_memory"):
        RayClusterHandle(object_store_memory=1 << 20)
