"""Single attempts over loopback: `KVPuller.attempt` / `KVPuller.report`, and
`GrpcKVTransport`, the KVTransport port on top of them."""

import asyncio
import inspect
import time

import pytest

from connector.grpc import GrpcKVTransport, KVHandoffServer, KVPuller, PullerConfig
from connector.link import LinkSpec
from connector.payload import block_payload
from connector.transport import DoneReport, PullAttempt, PullFailure

from .helpers import add_request, run

pytestmark = pytest.mark.timeout(60)


def make_attempt(
    request_id: str,
    address: str,
    remote_block_ids,
    block_indices=None,
    *,
    timeout_s: float = 1.0,
    number: int = 1,
    consumer_id: str = "decode-0",
) -> PullAttempt:
    remote = tuple(remote_block_ids)
    indices = tuple(range(len(remote)) if block_indices is None else block_indices)
    return PullAttempt(
        request_id=f"local-{request_id}",
        remote_request_id=request_id,
        remote_address=address,
        remote_block_ids=remote,
        local_block_ids=tuple(500 + i for i in indices),
        block_indices=indices,
        num_tokens=16 * len(remote),
        number=number,
        timeout_s=timeout_s,
        consumer_id=consumer_id,
    )


def make_report(request_id: str, address: str, *, success: bool = True, timeout_s: float = 1.0) -> DoneReport:
    return DoneReport(
        remote_request_id=request_id,
        remote_address=address,
        success=success,
        number=1,
        timeout_s=timeout_s,
        consumer_id="decode-0",
    )


async def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.005)


# -- KVPuller.attempt / report ---------------------------------------------------


def test_an_attempt_hands_every_block_to_on_block_under_its_prompt_index(source):
    add_request(source, "r", 6)
    got = []

    async def body():
        async with KVHandoffServer(source) as server, KVPuller() as puller:
            # a retry asking for the blocks at prompt positions 1, 3 and 4 only
            attempt = make_attempt("r", server.address, [1, 3, 4], [1, 3, 4], number=2)
            return attempt, await puller.attempt(attempt, lambda a, i, d: got.append((a, i, d)))

    attempt, result = run(body())
    assert (result.failure, result.reason, result.final) == (None, "", False)
    assert result.attempt is attempt and result.landed == (1, 3, 4)
    assert result.num_bytes == 3 * 1024 and result.checksum_failures == 0
    assert [(a is attempt, i, d) for a, i, d in got] == [(True, i, block_payload("r", i, 16, 64)) for i in (1, 3, 4)]


def test_an_attempt_for_an_unknown_request_is_final(source):
    async def body():
        async with KVHandoffServer(source) as server, KVPuller() as puller:
            return await puller.attempt(make_attempt("ghost", server.address, [1, 2]), lambda *a: None)

    result = run(body())
    assert (result.failure, result.final, result.landed) == (PullFailure.UNKNOWN_REQUEST, True, ())
    assert result.reason == "NOT_FOUND: not held"  # short and fixed: the input is never echoed


def test_an_attempt_with_corrupt_blocks_lands_the_rest_and_may_be_retried(source):
    add_request(source, "r", 4)

    def flip_block_2(request_id, block_id, data):
        return bytes([data[0] ^ 1]) + data[1:] if block_id == 2 else data

    async def body():
        async with KVHandoffServer(source, corrupt=flip_block_2) as server, KVPuller() as puller:
            return await puller.attempt(make_attempt("r", server.address, [0, 1, 2, 3]), lambda *a: None)

    result = run(body())
    assert (result.failure, result.final) == (PullFailure.CHECKSUM_MISMATCH, False)
    assert result.landed == (0, 1, 3) and result.checksum_failures == 1


@pytest.mark.parametrize(
    "link",
    [LinkSpec(outages=[(0.0, 60.0)]), LinkSpec(loss=0.999999)],
    ids=["outage", "lossy"],
)
def test_an_attempt_over_a_dead_link_times_out_within_its_timeout(source, link):
    add_request(source, "r", 2)

    async def body():
        async with KVHandoffServer(source) as server, KVPuller(link=link, link_epoch=time.monotonic()) as puller:
            started = time.monotonic()
            result = await puller.attempt(make_attempt("r", server.address, [0, 1], timeout_s=0.2), lambda *a: None)
            return result, time.monotonic() - started

    result, elapsed = run(body())
    assert (result.failure, result.final, result.landed) == (PullFailure.DEADLINE_EXCEEDED, False, ())
    assert 0.2 <= elapsed < 0.2 + 0.2  # the asyncio backstop adds 0.05 s at most


def test_an_on_block_that_raises_ends_the_attempt_with_a_sink_error(source):
    add_request(source, "r", 4)
    seen = []

    def on_block(attempt, index, data):
        if index == 2:
            raise ValueError("block 2 has the wrong shape")
        seen.append(index)

    async def body():
        async with KVHandoffServer(source) as server, KVPuller() as puller:
            return await puller.attempt(make_attempt("r", server.address, [0, 1, 2, 3]), on_block)

    result = run(body())
    assert (result.failure, result.final) == (PullFailure.SINK_ERROR, True)
    assert result.landed == (0, 1) == tuple(seen)
    assert result.reason == "ValueError: block 2 has the wrong shape"


def test_report_is_one_call_delivered_refused_or_lost(source):
    done = []

    async def body():
        server = KVHandoffServer(source, on_done=lambda r, ok: done.append((r, ok)))
        address = await server.start()
        async with KVPuller(None, PullerConfig(consumer_id="decode-0")) as puller:
            delivered = await puller.report(make_report("r", address, success=False))
            refused = await puller.report(make_report("", address))  # INVALID_ARGUMENT
            await server.stop(grace=0)
            lost = await puller.report(make_report("r2", address, timeout_s=0.2))
        return delivered, refused, lost

    delivered, refused, lost = run(body())
    assert (delivered.delivered, delivered.final) == (True, False)
    assert (refused.delivered, refused.final) == (False, True)
    assert (lost.delivered, lost.final) == (False, False)
    assert done == [("r", False)]


def test_a_puller_without_a_sink_cannot_pull():
    async def body():
        async with KVPuller() as puller:
            with pytest.raises(RuntimeError, match="no sink"):
                await puller.pull("r", "127.0.0.1:1", [1], [2])

    run(body())


# -- GrpcKVTransport ---------------------------------------------------------------


def test_the_transport_reports_every_attempt_exactly_once(source):
    add_request(source, "good", 3)
    add_request(source, "broken", 3, first_block_id=10)
    blocks, results = [], {}

    def on_block(attempt, index, data):
        if attempt.remote_request_id == "broken" and index == 1:
            raise ValueError("refused")
        blocks.append((attempt.remote_request_id, index))

    def on_result(result):
        results.setdefault(result.attempt.remote_request_id, []).append(result)

    async def body():
        async with KVHandoffServer(source) as server:
            transport = GrpcKVTransport(link=None, link_seed=0, link_epoch=time.monotonic(), consumer_id="d0")
            assert not inspect.iscoroutinefunction(transport.pull)
            assert not inspect.iscoroutinefunction(transport.report_done)
            attempts = [
                make_attempt("good", server.address, [0, 1, 2]),
                make_attempt("ghost", server.address, [0]),
                make_attempt("broken", server.address, [10, 11, 12]),
            ]
            for attempt in attempts:
                assert transport.pull(attempt, on_block, on_result) is None
            assert transport.in_flight == 3 and results == {}  # nothing runs until we yield
            await wait_until(lambda: transport.in_flight == 0)
            await asyncio.sleep(0.05)  # nothing more arrives
            await transport.close()

    run(body())
    assert {rid: len(r) for rid, r in results.items()} == {"good": 1, "ghost": 1, "broken": 1}
    assert (results["good"][0].failure, results["good"][0].landed) == (None, (0, 1, 2))
    assert results["ghost"][0].failure is PullFailure.UNKNOWN_REQUEST
    assert (results["broken"][0].failure, results["broken"][0].landed) == (PullFailure.SINK_ERROR, (0,))
    assert sorted(blocks) == [("broken", 0), ("good", 0), ("good", 1), ("good", 2)]


def test_an_unexpected_error_still_gives_one_result(source, monkeypatch):
    results = []

    async def body():
        async def explode(attempt, on_block):
            raise RuntimeError("bug in the puller")

        async with KVHandoffServer(source) as server, GrpcKVTransport(consumer_id="d0") as transport:
            monkeypatch.setattr(transport._puller, "attempt", explode)
            transport.pull(make_attempt("r", server.address, [0]), lambda *a: None, results.append)
            await wait_until(lambda: transport.in_flight == 0)

    run(body())
    assert len(results) == 1
    assert (results[0].failure, results[0].reason) == (PullFailure.PRODUCER_ERROR, "RuntimeError: bug in the puller")


def test_the_transport_delivers_a_done_report(source):
    add_request(source, "r", 1)
    done, results = [], []

    async def body():
        server = KVHandoffServer(source, on_done=lambda r, ok: done.append((r, ok)))
        async with server, GrpcKVTransport(consumer_id="d0") as transport:
            transport.report_done(make_report("r", server.address), results.append)
            assert transport.in_flight == 1
            await wait_until(lambda: transport.in_flight == 0)

    run(body())
    assert len(results) == 1 and results[0].delivered and not results[0].final
    assert done == [("r", True)]


def test_closing_the_transport_cancels_attempts_without_reporting_them(source):
    add_request(source, "r", 1)
    results = []

    async def body():
        async with KVHandoffServer(source) as server:
            transport = GrpcKVTransport(link=LinkSpec(outages=[(0.0, 60.0)]), link_epoch=time.monotonic())
            transport.pull(make_attempt("r", server.address, [0], timeout_s=30), lambda *a: None, results.append)
            await asyncio.sleep(0.05)
            assert transport.in_flight == 1
            await transport.close()
            assert transport.in_flight == 0
            with pytest.raises(RuntimeError, match="closed"):
                transport.pull(make_attempt("r", server.address, [0]), lambda *a: None, results.append)

    run(body())
    assert results == []
