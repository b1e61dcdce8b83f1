"""The proxy channel refuses strangers and forged events, without Ray: a
connection that cannot answer the run secret's challenge is dropped, a
second connection cannot replace a connected node, a node's events about a
request routed elsewhere are dropped, and a seeded fuzzer of raw frames,
authenticated or not, neither brings the proxy down nor finishes a request.
On 127.0.0.1."""

from __future__ import annotations

import asyncio
import random
import time

import msgpack
import pytest

from cluster.ray.proxy import ProxyServer
from cluster.wall.auth import answer
from cluster.wall.clock import RunClock
from cluster.wall.frames import FrameConnection
from cluster.wall.proxy_channel import ProxyChannel
from node.messages import OutputEvent
from proxy.client import Finished, Submission, Tokens

from .conftest import make_spec

pytestmark = pytest.mark.timeout(60)

SECRET = b"s" * 32


async def start_proxy(events: list):
    spec = make_spec(decode={"count": 2, "engine": {"num_gpu_blocks": 100}})
    server = ProxyServer(
        spec, 0, RunClock.from_wall_start(time.time()), ["prefill-0"], ["decode-0", "decode-1"], events.extend, SECRET
    )
    address = await server.start("127.0.0.1")
    return server, address


async def connect_node(address, name, secret=SECRET, requests=None):
    channel = ProxyChannel(name, (requests if requests is not None else []).extend, secret=secret)
    await channel.connect(*address)
    return channel


async def settle():
    await asyncio.sleep(0.1)


def test_strangers_and_impostors_are_refused():
    async def body():
        events: list = []
        server, address = await start_proxy(events)
        got: list = []
        real = await connect_node(address, "decode-0", requests=got)
        # no secret: never answers the challenge; a wrong secret; a second "decode-0"
        stranger = await FrameConnection.open(*address)
        stranger.send(["hello", "decode-1"])
        wrong = await FrameConnection.open(*address)
        await answer(wrong, b"w" * 32, "decode-1")
        wrong.send(["hello", "decode-1"])
        twin = await connect_node(address, "decode-0")
        await asyncio.sleep(0.3)
        server.submit([Submission("r1", 16, 4, 0)])
        await settle()
        refused = server.connections_refused
        held = list(server.conns)  # (a connection that ends leaves `conns`: a restarted node may come back)
        challenge = await stranger.recv()
        stranger_closed = await stranger.recv() is None
        for c in (real, twin):
            await c.close()
        await stranger.close()
        await wrong.close()
        await server.close()
        assert challenge[0] == "challenge"
        return refused, stranger_closed, held, got

    refused, stranger_closed, conns, got = asyncio.run(asyncio.wait_for(body(), 30))
    assert refused == 3  # the stranger, the wrong secret and the twin
    assert list(conns) == ["decode-0"]
    assert stranger_closed  # it got a challenge, then the door
    assert [m.request_id for m in got] == []  # r1 went to prefill-0, which never connected


def test_events_about_a_request_routed_elsewhere_are_dropped():
    async def body():
        events: list = []
        server, address = await start_proxy(events)
        prefill = await connect_node(address, "prefill-0")
        d0 = await connect_node(address, "decode-0")
        d1 = await connect_node(address, "decode-1")
        await settle()
        server.submit([Submission("r1", 16, 4, 0)])
        await settle()
        # r1 is at prefill-0; decode-1 claims it finished with made-up tokens
        d1.emit([OutputEvent("r1", [1, 2, 3, 4], "length", None, 0, 0.0)])
        await settle()
        seen = list(events)
        server.closing = True
        for c in (prefill, d0, d1):
            await c.close()
        await server.close()
        return seen, server.proxy.events_rejected

    events, rejected = asyncio.run(asyncio.wait_for(body(), 30))
    assert rejected == 1
    assert not [e for e in events if isinstance(e, (Tokens, Finished))]


def test_a_seeded_fuzzer_of_raw_frames_does_not_bring_the_proxy_down():
    rng = random.Random(99)

    def junk_frame() -> bytes:
        kind = rng.randrange(4)
        if kind == 0:  # random bytes, maybe with a plausible header
            body = rng.randbytes(rng.randrange(0, 200))
            return len(body).to_bytes(4, "big") + body if rng.random() < 0.5 else body
        if kind == 1:  # a huge announced length
            return (rng.randrange(1 << 27, 1 << 32)).to_bytes(4, "big")
        if kind == 2:  # well-formed msgpack of the wrong shape
            obj = rng.choice([["ev", "x"], ["ev", [["out", "r1", "a", 1, 2, 3, 4]]], ["ev", [["kv"]]], {"a": 1}, None])
            body = msgpack.packb(obj)
            return len(body).to_bytes(4, "big") + body
        body = msgpack.packb(["ev", [["out", "r1", [rng.randrange(100)], "length", None, 0, None]]])
        return len(body).to_bytes(4, "big") + body

    async def body():
        events: list = []
        server, address = await start_proxy(events)
        real = await connect_node(address, "prefill-0")
        await settle()
        server.submit([Submission("r1", 16, 4, 0)])
        for i in range(60):
            reader, writer = await asyncio.open_connection(*address)
            conn = FrameConnection(reader, writer)
            if i % 2:  # authenticated as decode-1, then junk
                await answer(conn, SECRET, "decode-1")
                conn.send(["hello", "decode-1"]) if i % 4 == 1 else None
            writer.write(junk_frame())
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.close()
        await asyncio.sleep(0.3)
        # the proxy still routes: a new request reaches the live prefill node
        got: list = []
        real.on_requests = got.extend
        server.submit([Submission("r2", 16, 4, 0)])
        await settle()
        await real.close()
        await server.close()
        return events, got

    events, got = asyncio.run(asyncio.wait_for(body(), 40))
    assert [m.request_id for m in got] == ["r2"]
    assert not [e for e in events if isinstance(e, Finished)]  # nothing forged finished r1
