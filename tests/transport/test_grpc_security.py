"""The KV service refuses strangers and stays up under abuse: calls without
the run's token are UNAUTHENTICATED; a pull or done report for a request
the producer never held is NOT_FOUND, one with a wrong ticket or from a
consumer other than the one the request is bound to PERMISSION_DENIED;
undecodable or oversized input is INVALID_ARGUMENT with a short message;
TLS works with certificates made at test time; 100 stalled readers of a
16 MiB pull stay under a memory bound; a seeded fuzzer does not bring the
service down. All on 127.0.0.1."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from connector.grpc import KVHandoffServer, KVPuller
from connector.grpc.security import AUTH_METADATA_KEY, KVSecurity
from connector.grpc.server import CHUNKS_HELD_PER_STREAM, DEFAULT_MAX_INFLIGHT_BYTES
from connector.grpc.wire import MAX_REQUEST_BYTES, channel_options
from connector.transport import InMemoryBlockSource, PullAttempt, PullFailure
from node.access import AccessList
from protos.disagg import kv_handoff_pb2 as pb

from .helpers import add_request, run

pytestmark = pytest.mark.timeout(120)

TOKEN = "t0k3n" * 8
SECURE = KVSecurity(auth_token=TOKEN)
PULL = "/disagg.KVHandoff/PullBlocks"
DONE = "/disagg.KVHandoff/ReportDone"
CHECK = "/disagg.KVHandoff/Check"


class GuardedSource(InMemoryBlockSource):
    """A producer with the `PrefillNode`'s access rules (`node.access`)."""

    def __init__(self) -> None:
        super().__init__()
        self.access = AccessList(b"test-key")

    def hold(self, request_id: str, num_blocks: int) -> str:
        add_request(self, request_id, num_blocks)
        return self.access.grant(request_id)

    def authorize(self, request_id: str, ticket: str, consumer: str) -> None:
        self.access.check(request_id, ticket, consumer)

    def check_blocks(self, request_id, block_ids):
        return 16 * len(self.get_blocks(request_id, block_ids))

    def on_done_report(self, request_id, success):
        self.remove(request_id)


def attempt(rid, address, ticket="", consumer="decode-0", blocks=(0, 1)):
    return PullAttempt(
        rid, rid, address, tuple(blocks), tuple(blocks), tuple(range(len(blocks))), 32, 1, 5.0, consumer, ticket
    )


async def raw_call(address, method, payload: bytes, metadata=((AUTH_METADATA_KEY, TOKEN),), unary=True):
    """One call with raw request bytes; returns the status code (OK when it succeeded)."""
    async with grpc.aio.insecure_channel(address) as channel:
        if unary:
            call = channel.unary_unary(method)(payload, metadata=metadata, timeout=5)
            try:
                await call
            except grpc.aio.AioRpcError as err:
                return err.code(), err.details()
            return grpc.StatusCode.OK, ""
        stream = channel.unary_stream(method)(payload, metadata=metadata, timeout=5)
        try:
            async for _ in stream:
                pass
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details()
        return grpc.StatusCode.OK, ""


def test_calls_without_the_run_token_are_unauthenticated():
    source = GuardedSource()
    ticket = source.hold("r1", 2)

    async def body():
        async with KVHandoffServer(source, security=SECURE) as server:
            request = pb.PullRequest(request_id="r1", block_ids=[0, 1], ticket=ticket).SerializeToString()
            done = pb.DoneRequest(request_id="r1", success=True, ticket=ticket).SerializeToString()
            return [
                await raw_call(server.address, PULL, request, metadata=(), unary=False),
                await raw_call(server.address, PULL, request, metadata=((AUTH_METADATA_KEY, "guess"),), unary=False),
                await raw_call(server.address, DONE, done, metadata=()),
                await raw_call(server.address, CHECK, b"", metadata=()),
            ]

    codes = {code for code, _ in run(body())}
    assert codes == {grpc.StatusCode.UNAUTHENTICATED}
    assert "r1" in source  # nothing was served or released


def test_third_party_pulls_and_done_reports_are_refused():
    source = GuardedSource()
    ticket = source.hold("r1", 2)
    source.hold("r2", 2)

    async def body():
        async with (
            KVHandoffServer(source, security=SECURE) as server,
            KVPuller(security=SECURE) as puller,
        ):
            addr = server.address
            out = {
                "no ticket": await puller.attempt(attempt("r1", addr), lambda *a: None),
                "wrong ticket": await puller.attempt(attempt("r1", addr, ticket="0" * 32), lambda *a: None),
                "never held": await puller.attempt(attempt("r9", addr, ticket=ticket), lambda *a: None),
                "routed consumer": await puller.attempt(attempt("r1", addr, ticket=ticket), lambda *a: None),
                "other consumer": await puller.attempt(
                    attempt("r1", addr, ticket=ticket, consumer="decode-1"), lambda *a: None
                ),
            }
            done = pb.DoneRequest
            out["done never held"] = await raw_call(addr, DONE, done(request_id="r9", success=True).SerializeToString())
            out["done wrong ticket"] = await raw_call(
                addr, DONE, done(request_id="r2", success=True, ticket="x").SerializeToString()
            )
            out["done other consumer"] = await raw_call(
                addr, DONE, done(request_id="r1", success=True, ticket=ticket, consumer_id="x").SerializeToString()
            )
            return out

    out = run(body())
    assert (out["no ticket"].failure, out["no ticket"].reason) == (PullFailure.REJECTED, "PERMISSION_DENIED: not yours")
    assert out["wrong ticket"].failure is PullFailure.REJECTED
    assert out["never held"].failure is PullFailure.UNKNOWN_REQUEST
    assert out["routed consumer"].failure is None and out["routed consumer"].landed == (0, 1)
    assert out["other consumer"].failure is PullFailure.REJECTED  # bound to decode-0 by its first pull
    assert out["done never held"] == (grpc.StatusCode.NOT_FOUND, "not held")
    assert out["done wrong ticket"] == (grpc.StatusCode.PERMISSION_DENIED, "not yours")
    assert out["done other consumer"] == (grpc.StatusCode.PERMISSION_DENIED, "not yours")
    assert "r1" in source and "r2" in source  # no false done report released anything
    assert source.access.denied == 5


def test_undecodable_and_oversized_input_is_invalid_argument_with_a_short_message():
    source = GuardedSource()

    async def body():
        async with KVHandoffServer(source, security=SECURE) as server:
            addr = server.address
            long_id = pb.PullRequest(request_id="x" * 300, block_ids=[1]).SerializeToString()
            many_ids = pb.PullRequest(request_id="r", block_ids=list(range(70_000))).SerializeToString()
            assert len(many_ids) < MAX_REQUEST_BYTES  # refused by the servicer, not by size
            huge_id = pb.PullRequest(request_id="x" * (1 << 20), block_ids=[1]).SerializeToString()
            invalid = [
                await raw_call(addr, PULL, b"\xff\xff\xff\xff", unary=False),
                await raw_call(addr, DONE, b"\x0a\xff"),
                await raw_call(addr, PULL, long_id, unary=False),
                await raw_call(addr, PULL, many_ids, unary=False),
                await raw_call(addr, DONE, pb.DoneRequest(request_id="y" * 300).SerializeToString()),
            ]
            # Past the request size limit gRPC itself refuses, from the length prefix.
            too_big = [
                await raw_call(addr, PULL, huge_id, unary=False),
                await raw_call(addr, DONE, pb.DoneRequest(request_id="y" * (1 << 20)).SerializeToString()),
            ]
            return invalid, too_big

    invalid, too_big = run(body())
    for code, details in invalid:
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert len(details) <= 80
    assert [code for code, _ in too_big] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2


def _make_certs(tmp: Path) -> tuple[bytes, bytes, bytes]:
    """A throwaway CA and a server certificate for the name 'kv.test'."""

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "1", "-subj", "/CN=test-ca")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=kv.test")
    (tmp / "ext.cnf").write_text("subjectAltName=DNS:kv.test\n")
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "srv.pem", "-days", "1", "-extfile", "ext.cnf")  # fmt: skip
    return (tmp / "ca.pem").read_bytes(), (tmp / "srv.pem").read_bytes(), (tmp / "srv.key").read_bytes()


def test_pulls_over_tls_with_certificates_made_at_test_time(tmp_path):
    ca, cert, key = _make_certs(tmp_path)
    source = GuardedSource()
    ticket = source.hold("r1", 2)
    server_security = KVSecurity(auth_token=TOKEN, cert_chain=cert, private_key=key)
    client_security = KVSecurity(auth_token=TOKEN, root_certificates=ca, server_name="kv.test")

    async def body():
        async with KVHandoffServer(source, security=server_security) as server:
            async with KVPuller(security=client_security) as puller:
                ok = await puller.attempt(attempt("r1", server.address, ticket=ticket), lambda *a: None)
            async with KVPuller(security=SECURE) as plain:  # no TLS: the handshake fails
                refused = await plain.attempt(attempt("r1", server.address, ticket=ticket), lambda *a: None)
            return ok, refused

    ok, refused = run(body())
    assert ok.failure is None and ok.landed == (0, 1)
    assert refused.failure is PullFailure.PRODUCER_UNAVAILABLE


# docs/security.md, "Memory": the KV server's growth while 100 readers of a
# 16 MiB pull stall (1.6 GiB if each pull were built up front and kept).
STALLED_READERS_BOUND = 256 << 20
STREAM_BOUND_S = 10.0  # the stall server's bound on one stream
CUT_GRACE_S = 50.0  # how late past its bound a loaded machine may cut a stream
# Issue 34: what strangers may make the server hold, and what it may keep
# once the streams that used it have ended.
FLOOD_BOUND = 64 << 20
RELEASE_GRACE_S = 30.0  # how long after the last stream ends its memory may still be held


class StallServer:
    """tests/transport/stall_server.py in its own process, so its memory is its own."""

    def __init__(self, max_stream_s: float, token: str | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.transport.stall_server", str(max_stream_s)] + ([token] if token else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        self.address = self.process.stdout.readline().strip()

    def state(self) -> dict[str, int]:
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        names = ("peak_rss", "active", "peak_active", "cut", "rss", "refused")
        return dict(zip(names, map(int, self.process.stdout.readline().split())))

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def test_100_stalled_readers_stay_under_the_memory_bound_and_are_cut_off():
    # The server's stream bound. Counts and memory are high-water marks, so
    # a slow machine where early streams end before the last one is read
    # does not change what is measured.
    server = StallServer(STREAM_BOUND_S)

    async def body(address):
        request = pb.PullRequest(request_id="big", block_ids=list(range(64))).SerializeToString()
        # No window growth: a stalled reader's stream cannot end by filling
        # ever larger flow-control windows (grpc's BDP probing grows them on
        # a fast machine), so the server's bound is what ends it.
        options = [("grpc.http2.bdp_probe", 0)]
        channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(10)]
        started = time.monotonic()
        calls = [channels[i % 10].unary_stream(PULL)(request) for i in range(100)]
        before = server.state()["peak_rss"]
        for call in calls:
            await call.read()  # one chunk each, then the reader stalls
        await asyncio.sleep(1.0)
        during = server.state()
        # Stall until the server's bound has cut every stream (its timers fire
        # late on a loaded machine: reading on at a fixed time would resume a
        # stream the bound has not cut yet, and it would end OK).
        deadline = started + STREAM_BOUND_S + CUT_GRACE_S
        while server.state()["cut"] < len(calls) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        codes = []
        for call in calls:  # the server's own bound ends every stalled stream
            try:
                while await call.read() is not grpc.aio.EOF:
                    await asyncio.sleep(0.01)
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as err:
                codes.append(err.code())
        for channel in channels:
            await channel.close()
        return during["peak_rss"] - before, during["peak_active"], codes

    try:
        grown, active_while_stalled, codes = run(body(server.address), timeout_s=90)
        after = server.state()
    finally:
        server.close()
    assert active_while_stalled == 100
    assert grown < STALLED_READERS_BOUND, f"{grown >> 20} MiB"
    # Every stream stalled past the bound: the server cut each one, and each reader saw why.
    assert after["cut"] == 100
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 100
    assert after["active"] == 0


def test_an_unauthenticated_flood_of_8mib_requests_is_refused_before_it_is_buffered():
    """Issue 34, finding 1: 300 requests of ~8 MiB without the token took a
    prefill node from 166 MB to 2.38 GB. Refused on their metadata now,
    none of them is read: the server's peak stays within 64 MiB of its start."""
    server = StallServer(STREAM_BOUND_S, token=TOKEN)
    payload = pb.PullRequest(request_id="big", block_ids=[1], ticket="x" * (8 << 20)).SerializeToString()
    small = pb.PullRequest(request_id="big", block_ids=[1]).SerializeToString()

    async def flood(address):
        async with grpc.aio.insecure_channel(address) as channel:

            async def one(body):
                try:
                    async for _ in channel.unary_stream(PULL)(body, timeout=30):
                        pass
                except grpc.aio.AioRpcError as err:
                    return err.code()
                return grpc.StatusCode.OK

            big = await asyncio.gather(*(one(payload) for _ in range(300)))
            return big, await one(small)

    try:
        start = server.state()
        big, small_code = run(flood(server.address), timeout_s=100)
        after = server.state()
    finally:
        server.close()
    # Refused on their headers; under the flood grpc may also drop the
    # connection (UNAVAILABLE) before a stream is answered. None is served.
    assert set(big) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE}
    assert big.count(grpc.StatusCode.UNAUTHENTICATED) >= 150
    assert small_code is grpc.StatusCode.UNAUTHENTICATED
    assert after["refused"] >= 151 and after["peak_active"] == 0
    assert after["peak_rss"] - start["rss"] < FLOOD_BOUND, f"{(after['peak_rss'] - start['rss']) >> 20} MiB"


def test_stalled_readers_of_4mib_chunks_are_bounded_and_their_memory_released():
    """Issue 34, finding 1: 100 stalled readers asking for 4 MiB chunks left
    the server at 1.26 GB after their streams ended. Now the server admits
    as many as its chunk budget holds (RESOURCE_EXHAUSTED beyond), and gives
    the memory back when the streams end."""
    # The bound only ends streams the test fails to cancel: long enough that
    # none ends (and frees its budget) while a loaded machine reads the first
    # chunks one call after another.
    server = StallServer(STREAM_BOUND_S)
    request = pb.PullRequest(request_id="big", block_ids=list(range(64)), max_chunk_bytes=4 << 20).SerializeToString()

    async def body(address):
        options = channel_options() + [("grpc.http2.bdp_probe", 0)]  # 4 MiB chunks need the 8 MiB limit
        channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(10)]
        calls = [channels[i % 10].unary_stream(PULL)(request) for i in range(100)]
        codes = []
        for call in calls:
            try:
                await call.read()
                codes.append(None)  # served; stalls from here
            except grpc.aio.AioRpcError as err:
                codes.append(err.code())
        await asyncio.sleep(0.5)
        during = server.state()
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()
        # Cancelled streams end at once, or at the latest at the server's bound.
        deadline = time.monotonic() + STREAM_BOUND_S + CUT_GRACE_S
        while server.state()["active"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return codes, during

    try:
        start = server.state()
        codes, during = run(body(server.address), timeout_s=90)
        after = server.state()
        # The streams' buffers go back when grpc's core tears the cancelled
        # streams down, which trails the handler's count on a loaded machine
        # (118 MiB still held at the first sample once, under a full suite
        # with two other jobs): sample until released, within a bound.
        deadline = time.monotonic() + RELEASE_GRACE_S
        while after["rss"] - start["rss"] >= FLOOD_BOUND and time.monotonic() < deadline:
            time.sleep(0.5)
            after = server.state()
    finally:
        server.close()
    served = DEFAULT_MAX_INFLIGHT_BYTES // (CHUNKS_HELD_PER_STREAM * (4 << 20))
    assert codes.count(None) == served == 42
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 100 - served
    assert during["peak_active"] == served
    assert after["active"] == 0
    assert after["rss"] - start["rss"] < FLOOD_BOUND, f"{(after['rss'] - start['rss']) >> 20} MiB held"


def test_a_seeded_fuzzer_gets_proper_status_codes_and_the_service_stays_up():
    rng = random.Random(1234)
    source = GuardedSource()
    source.hold("r1", 4)
    allowed = {
        grpc.StatusCode.OK,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
    }

    def fuzz_payload() -> bytes:
        kind = rng.randrange(4)
        if kind == 0:
            return rng.randbytes(rng.randrange(0, 64))
        if kind == 1:
            ids = [rng.randrange(0, 2**32) for _ in range(rng.randrange(0, 20))]
            rid = rng.choice(["r1", "", "x" * rng.randrange(300), "\u00e9"])
            return pb.PullRequest(request_id=rid, block_ids=ids, ticket=rng.choice(["", "t"])).SerializeToString()
        if kind == 2:
            good = pb.DoneRequest(request_id="r1", success=True).SerializeToString()
            return bytes(b ^ rng.randrange(256) if rng.random() < 0.2 else b for b in good)
        return pb.PullRequest(
            request_id="r1", block_ids=[0, 1], max_chunk_bytes=rng.randrange(2**32)
        ).SerializeToString()

    async def body():
        seen = []
        async with KVHandoffServer(source, security=SECURE) as server:
            for _ in range(300):
                method = rng.choice([PULL, DONE, CHECK])
                metadata = ((AUTH_METADATA_KEY, TOKEN),) if rng.random() < 0.8 else ()
                code, details = await raw_call(server.address, method, fuzz_payload(), metadata, unary=method != PULL)
                seen.append(code)
                assert len(details) <= 80
            alive = await raw_call(server.address, CHECK, b"")
        return seen, alive

    seen, alive = run(body(), timeout_s=100)
    assert set(seen) <= allowed, set(seen) - allowed
    assert alive == (grpc.StatusCode.OK, "")
    assert "r1" in source  # no fuzzed report released the held request
