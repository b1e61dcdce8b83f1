"""Link impairments applied by the gRPC client interceptors, over loopback."""

import statistics
import time

import grpc
import pytest

from connector.grpc import KVHandoffServer, KVPuller, PullerConfig
from connector.grpc.link import link_interceptors
from connector.link import Link, LinkSpec
from connector.payload import block_payload
from connector.transport import InMemoryBlockSink
from protos.disagg import kv_handoff_pb2 as pb
from protos.disagg import kv_handoff_pb2_grpc as pb_grpc

from .helpers import add_request, run

pytestmark = pytest.mark.timeout(60)


async def timed_pull(puller: KVPuller, address: str, blocks: dict) -> tuple[float, float]:
    result = await puller.pull("r", address, list(blocks), list(range(len(blocks))))
    assert result.ok and result.attempts == 1
    return result.transfer_s, result.total_s


def test_injected_delay_raises_the_median_pull_latency_by_the_round_trips(source):
    """10 ms each way = 20 ms per round trip. A pull is one PullBlocks round
    trip (the data) plus one ReportDone round trip: +20 ms to the data,
    +40 ms to the whole pull. Sleeps never end early, so every delayed pull
    takes at least that (a bound per pull: a difference of two medians is
    not one when load from elsewhere slows a plain pull more than a delayed
    one). Plain and delayed pulls alternate so that such load hits both
    alike, and the upper bounds on the added medians allow for scheduling."""
    blocks = add_request(source, "r", 16)

    async def body():
        async with KVHandoffServer(source) as server:
            config = PullerConfig(attempt_timeout_s=2.0, deadline_s=5.0)
            async with (
                KVPuller(InMemoryBlockSink(), config) as plain,
                KVPuller(InMemoryBlockSink(), config, link=LinkSpec(delay_ms=10)) as slowed,
            ):
                await timed_pull(plain, server.address, blocks)  # warm up both channels
                await timed_pull(slowed, server.address, blocks)
                base, delayed = [], []
                for _ in range(15):
                    base.append(await timed_pull(plain, server.address, blocks))
                    delayed.append(await timed_pull(slowed, server.address, blocks))
        median = lambda samples, k: statistics.median(s[k] for s in samples)  # noqa: E731
        added = median(delayed, 0) - median(base, 0), median(delayed, 1) - median(base, 1)
        return added, min(s[0] for s in delayed), min(s[1] for s in delayed)

    (transfer_added, total_added), shortest_transfer, shortest_total = run(body())
    assert shortest_transfer >= 0.020 and shortest_total >= 0.040
    assert transfer_added <= 0.032
    assert total_added <= 0.060


def test_bandwidth_cap_paces_the_stream(source):
    # 4 blocks x 2 MiB = 8.39 MB at 40 MB/s: at least 0.21 s on the modelled wire
    blocks = add_request(source, "r", 4, bytes_per_token="llama-3-8b-fp16")

    async def body():
        async with KVHandoffServer(source) as server:
            config = PullerConfig(attempt_timeout_s=5.0, deadline_s=10.0, report_done=False)
            async with KVPuller(InMemoryBlockSink(), config, link=LinkSpec(bandwidth_MBps=40)) as puller:
                return await puller.pull("r", server.address, list(blocks), [0, 1, 2, 3])

    result = run(body())
    expected = result.num_bytes / 40e6
    assert result.ok and result.num_bytes == 8 * 1024 * 1024
    assert expected <= result.transfer_s < expected + 0.3


def test_a_lossy_link_still_completes_through_retries(source):
    requests = {f"r{n}": add_request(source, f"r{n}", 12, first_block_id=100 * n) for n in range(4)}

    async def body():
        async with KVHandoffServer(source, default_chunk_bytes=4096) as server:  # 3 chunks per pull
            config = PullerConfig(attempt_timeout_s=0.1, deadline_s=10.0)
            sink = InMemoryBlockSink()
            async with KVPuller(sink, config, link=LinkSpec(delay_ms=1, loss=0.25), link_seed=1) as puller:
                results = [
                    await puller.pull(rid, server.address, list(blocks), [1000 * n + i for i in range(12)])
                    for n, (rid, blocks) in enumerate(requests.items())
                ]
                link = puller.link_for(server.address)
        return sink, results, link

    sink, results, link = run(body())
    assert all(r.ok and r.done_reported for r in results)
    assert link.forward.lost > 0 and link.reverse.lost > 0
    assert sum(r.attempts for r in results) > len(results)  # some pulls needed a retry
    for n, rid in enumerate(requests):
        assert [sink.blocks[1000 * n + i] for i in range(12)] == [block_payload(rid, i, 16, 64) for i in range(12)]


def test_an_outage_window_blocks_pulls_until_it_ends(source):
    blocks = add_request(source, "r", 4)

    async def body():
        async with KVHandoffServer(source) as server:
            epoch = time.monotonic()
            config = PullerConfig(attempt_timeout_s=0.1, deadline_s=5.0, backoff_max_s=0.05)
            link = LinkSpec(outages=[(0.0, 0.4)])
            async with KVPuller(InMemoryBlockSink(), config, link=link, link_epoch=epoch) as puller:
                result = await puller.pull("r", server.address, list(blocks), [0, 1, 2, 3])
                return result, time.monotonic() - epoch

    result, elapsed = run(body())
    assert result.ok and result.attempts >= 3
    assert elapsed >= 0.4


def test_a_dropped_unary_call_fails_with_unavailable_or_times_out(source):
    never = LinkSpec(loss=0.999999)

    async def body():
        async with KVHandoffServer(source) as server:
            link = Link(never, seed=0)
            async with grpc.aio.insecure_channel(server.address, interceptors=link_interceptors(link)) as channel:
                stub = pb_grpc.KVHandoffStub(channel)
                codes = []
                started = time.monotonic()
                for timeout in (None, 0.1):
                    try:
                        await stub.Check(pb.HealthCheckRequest(), timeout=timeout)
                    except grpc.aio.AioRpcError as err:
                        codes.append((err.code(), round(time.monotonic() - started, 1)))
                try:
                    async for _ in stub.PullBlocks(pb.PullRequest(request_id="x", block_ids=[1]), timeout=0.1):
                        pass
                except grpc.aio.AioRpcError as err:
                    codes.append((err.code(), None))
                return codes, link

    codes, link = run(body())
    assert codes == [
        (grpc.StatusCode.UNAVAILABLE, 0.0),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 0.1),
        (grpc.StatusCode.DEADLINE_EXCEEDED, None),
    ]
    assert (link.forward.sent, link.forward.lost) == (3, 3)


def test_stream_messages_overlap_on_the_modelled_wire(source):
    """16 chunks on a 100 ms link arrive ~100 ms after sending, not 16 x 100 ms.
    (The bound leaves ~0.6 s for a loaded machine's scheduling; one after
    another the chunks would take over 1.6 s.)"""
    blocks = add_request(source, "r", 64)

    async def body():
        async with KVHandoffServer(source, default_chunk_bytes=4096) as server:
            config = PullerConfig(attempt_timeout_s=2.0, deadline_s=5.0, report_done=False)
            async with KVPuller(InMemoryBlockSink(), config, link=LinkSpec(delay_ms=100)) as puller:
                result = await puller.pull("r", server.address, list(blocks), list(range(64)))
                return result, puller.link_for(server.address)

    result, link = run(body())
    assert result.ok and link.reverse.sent == 16 + 1  # 16 chunks and the closing status
    assert 0.200 <= result.transfer_s < 0.800  # the request's trip and the chunks' one trip


def test_links_can_be_asymmetric_and_an_ideal_link_adds_no_interceptor(source):
    blocks = add_request(source, "r", 2)

    async def body():
        async with KVHandoffServer(source) as server:
            async with (
                KVPuller(InMemoryBlockSink(), reverse_link=LinkSpec(delay_ms=5)) as one_way,
                KVPuller(InMemoryBlockSink(), link=LinkSpec()) as ideal,
            ):
                assert (await one_way.pull("r", server.address, list(blocks), [0, 1])).ok
                assert (await ideal.pull("r", server.address, list(blocks), [0, 1])).ok
                return one_way.link_for(server.address), ideal.link_for(server.address)

    one_way, ideal = run(body())
    assert one_way.forward.spec.is_ideal and one_way.reverse.spec.delay_ms == 5
    assert (one_way.forward.sent, one_way.reverse.sent) == (2, 3)  # Pull, Done / chunk, status, ack
    assert ideal is None
