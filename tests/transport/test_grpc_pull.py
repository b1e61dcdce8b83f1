"""A real gRPC pull over loopback: server with a BlockSource, KVPuller into a sink."""

import asyncio
import time

import grpc
import pytest

from connector.grpc import KVHandoffServer, KVPuller, PullerConfig
from connector.payload import block_payload
from connector.transport import InMemoryBlockSink, PullFailure
from protos.disagg import kv_handoff_pb2 as pb
from protos.disagg import kv_handoff_pb2_grpc as pb_grpc

from .helpers import add_request, run

pytestmark = pytest.mark.timeout(60)

FAST = PullerConfig(attempt_timeout_s=0.5, deadline_s=2.0)


def test_pull_writes_every_block_verified_and_reports_done(source):
    reqs = {f"req-{n}": add_request(source, f"req-{n}", 8 + n, first_block_id=100 * n) for n in range(3)}
    done = []

    async def body():
        async with KVHandoffServer(source, on_done=lambda r, ok: done.append((r, ok))) as server:
            assert server.address.startswith("127.0.0.1:")
            sink = InMemoryBlockSink()
            async with KVPuller(sink, FAST) as puller:
                assert await puller.check(server.address)
                results = []
                for n, (rid, blocks) in enumerate(reqs.items()):
                    local = [1000 * (n + 1) + i for i in range(len(blocks))]
                    results.append(await puller.pull(rid, server.address, list(blocks), local))
                assert puller.open_channels == 1
            return sink, results

    sink, results = run(body())
    for n, (rid, blocks) in enumerate(reqs.items()):
        result = results[n]
        assert (result.ok, result.failure, result.attempts) == (True, None, 1)
        assert (result.num_blocks, result.num_bytes) == (len(blocks), 1024 * len(blocks))
        assert result.done_reported and result.checksum_failures == 0
        for i in range(len(blocks)):
            assert sink.blocks[1000 * (n + 1) + i] == block_payload(rid, i, 16, 64)
    assert sink.writes[:2] == [(1000, "req-0", 0), (1001, "req-0", 1)]
    assert done == [(rid, True) for rid in reqs]


def test_large_blocks_split_across_chunks_arrive_whole(source):
    blocks = add_request(source, "big", 4, bytes_per_token="llama-3-8b-fp16")  # 4 x 2 MiB

    async def body():
        async with KVHandoffServer(source, default_chunk_bytes=512 * 1024) as server:
            sink = InMemoryBlockSink()
            async with KVPuller(sink, FAST) as puller:
                result = await puller.pull("big", server.address, list(blocks), [7, 8, 9, 10])
            return sink, result

    sink, result = run(body())
    assert result.ok and result.num_bytes == 4 * 2 * 1024 * 1024
    assert [sink.blocks[7 + i] for i in range(4)] == list(blocks.values())


def test_a_persistently_corrupted_block_is_detected_and_never_written(source):
    blocks = add_request(source, "r", 6)
    done = []

    def flip_block_3(request_id, block_id, data):
        return bytes([data[0] ^ 0xFF]) + data[1:] if block_id == 3 else data

    async def body():
        server = KVHandoffServer(source, on_done=lambda r, ok: done.append((r, ok)), corrupt=flip_block_3)
        async with server:
            sink = InMemoryBlockSink()
            puller = KVPuller(sink, PullerConfig(attempt_timeout_s=0.5, deadline_s=0.5))
            result = await puller.pull("r", server.address, list(blocks), list(range(6)))
            for _ in range(100):  # the failure report goes out in the background
                if done:
                    break
                await asyncio.sleep(0.01)
            await puller.close()
        return sink, result

    sink, result = run(body())
    assert (result.ok, result.failure) == (False, PullFailure.CHECKSUM_MISMATCH)
    assert result.checksum_failures == result.attempts >= 2  # only block 3 was re-pulled
    assert result.num_blocks == 5 and sorted(sink.blocks) == [0, 1, 2, 4, 5]
    assert done == [("r", False)]


def test_a_block_corrupted_once_is_re_pulled_alone(source):
    blocks = add_request(source, "r", 6)
    corrupted = []

    def flip_once(request_id, block_id, data):
        if block_id == 2 and not corrupted:
            corrupted.append(block_id)
            return data[:-1] + bytes([data[-1] ^ 1])
        return data

    async def body():
        async with KVHandoffServer(source, corrupt=flip_once) as server:
            sink = InMemoryBlockSink()
            async with KVPuller(sink, FAST) as puller:
                result = await puller.pull("r", server.address, list(blocks), list(range(6)))
        return sink, result

    sink, result = run(body())
    assert (result.ok, result.attempts, result.checksum_failures) == (True, 2, 1)
    assert [w[0] for w in sink.writes] == [0, 1, 3, 4, 5, 2]
    assert sink.blocks == {i: block_payload("r", i, 16, 64) for i in range(6)}


def test_unknown_request_fails_at_once_without_retrying(source):
    async def body():
        async with KVHandoffServer(source) as server:
            async with KVPuller(InMemoryBlockSink(), FAST) as puller:
                return await puller.pull("ghost", server.address, [1, 2], [3, 4])

    result = run(body())
    assert (result.ok, result.failure, result.attempts) == (False, PullFailure.UNKNOWN_REQUEST, 1)
    assert result.reason == "NOT_FOUND: not held"  # the input is never echoed


def test_a_stopped_producer_makes_the_pull_fail_within_its_deadline(source):
    blocks = add_request(source, "r", 4)

    async def body():
        server = KVHandoffServer(source)
        address = await server.start()
        async with KVPuller(InMemoryBlockSink(), PullerConfig(attempt_timeout_s=0.3, deadline_s=1.0)) as puller:
            assert (await puller.pull("r", address, list(blocks), list(range(4)))).ok
            await server.stop(grace=0)
            assert not await puller.check(address, timeout_s=0.2)
            started = time.monotonic()
            result = await puller.pull("r", address, list(blocks), list(range(4)))
            return result, time.monotonic() - started

    result, elapsed = run(body())
    assert (result.ok, result.failure) == (False, PullFailure.PRODUCER_UNAVAILABLE)
    assert result.attempts >= 2  # it did retry
    assert elapsed < 1.0 + 0.25


def test_a_sink_that_raises_fails_the_pull(source):
    blocks = add_request(source, "r", 3)

    class BrokenSink:
        def write_block(self, local_block_id, request_id, block_index, data):
            raise OSError("disk full")

    async def body():
        async with KVHandoffServer(source) as server:
            async with KVPuller(BrokenSink(), FAST) as puller:
                return await puller.pull("r", server.address, list(blocks), [0, 1, 2])

    result = run(body())
    assert (result.ok, result.failure, result.num_blocks) == (False, PullFailure.SINK_ERROR, 0)
    assert "disk full" in result.reason


def test_concurrent_pulls_are_bounded(source):
    for n in range(6):
        add_request(source, f"r{n}", 1, first_block_id=n)
    active, peak = set(), []

    class SlowSink:
        async def write_block(self, local_block_id, request_id, block_index, data):
            active.add(request_id)
            peak.append(len(active))
            await asyncio.sleep(0.05)
            active.discard(request_id)

    async def body():
        async with KVHandoffServer(source) as server:
            config = PullerConfig(attempt_timeout_s=1.0, deadline_s=3.0, max_concurrent_pulls=2)
            async with KVPuller(SlowSink(), config) as puller:
                return await asyncio.gather(*(puller.pull(f"r{n}", server.address, [n], [n]) for n in range(6)))

    results = run(body())
    assert all(r.ok for r in results)
    assert max(peak) == 2


def test_done_reports_are_idempotent_over_the_wire(source):
    add_request(source, "r", 1)
    done = []

    async def body():
        async with KVHandoffServer(source, on_done=lambda r, ok: done.append(r)) as server:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.KVHandoffStub(channel)
                acks = [await stub.ReportDone(pb.DoneRequest(request_id="r", success=True)) for _ in range(2)]
                with pytest.raises(grpc.aio.AioRpcError) as bad:
                    async for _ in stub.PullBlocks(pb.PullRequest(request_id="r", block_ids=[0, 0])):
                        pass
                return acks, bad.value.code()

    acks, code = run(body())
    assert [a.first_report for a in acks] == [True, False]
    assert done == ["r"]
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_pull_arguments_are_rejected_before_any_call():
    async def body():
        async with KVPuller(InMemoryBlockSink()) as puller:
            for args, message in [
                (("r", "127.0.0.1:1", [1, 2], [1]), "equal length"),
                (("r", "127.0.0.1:1", [], []), "non-empty"),
                (("r", "127.0.0.1:1", [1, 1], [2, 3]), "must not repeat"),
                (("r", "127.0.0.1:1", [-1], [2]), r"ints in \[0, 2\*\*32\)"),
                (("", "127.0.0.1:1", [1], [2]), "request_id"),
            ]:
                with pytest.raises(ValueError, match=message):
                    await puller.pull(*args)

    run(body())
    with pytest.raises(ValueError, match="PullerConfig.deadline_s"):
        PullerConfig(deadline_s=0)
    with pytest.raises(ValueError, match="PullerConfig.max_chunk_bytes"):
        PullerConfig(max_chunk_bytes=100)
