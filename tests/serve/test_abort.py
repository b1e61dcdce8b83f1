"""`InProcCluster.abort` (a client that went away) at every stage of a
request's life, on the virtual clock: whatever it was doing, the request
ends "abort", no scheduler keeps it and every block pool ends fully free."""

from __future__ import annotations

import pytest

from cluster.inproc import InProcCluster
from engine.records import WorkloadRequest

from .conftest import serve_spec


def run_abort_at(t: float) -> tuple[InProcCluster, list[str]]:
    spec = serve_spec(links={"kv": {"delay_ms": 20.0}, "proxy": {"delay_ms": 1.0}})
    cluster = InProcCluster(spec, seed=0)
    cluster.submit([WorkloadRequest("r0", 0.0, 300, 50), WorkloadRequest("r1", 0.0, 300, 50)])
    cluster.loop.advance_to(t)
    assert cluster.abort("r0") is True
    cluster.loop.run()
    errors = [e for node in cluster.nodes.values() for e in node.core.end_of_run_errors()]
    return cluster, errors


@pytest.mark.parametrize(
    "t, phase, released",
    [
        # Without an abort, r0 is prefilled 0.001-0.099 s, handed to the decode
        # node at 0.100 s (arriving 0.101 s), pulled 0.101-0.141 s, decoded to 0.553 s.
        (0.0005, "in transit to the prefill node", 0),
        (0.050, "prefilling", 0),
        (0.0995, "prefilled, its output on the way to the proxy", 1),
        (0.1005, "in transit to the decode node", 1),
        (0.120, "its KV blocks being pulled", 1),
        (0.300, "decoding", 0),
    ],
)
def test_abort_frees_everything(t, phase, released):
    cluster, errors = run_abort_at(t)
    assert errors == [], phase
    r0, r1 = cluster.records["r0"], cluster.records["r1"]
    assert r0.finish_reason == "abort" and cluster.requests_aborted == 1
    assert (r1.finish_reason, len(r1.output_token_ids)) == ("length", 50)  # the other request is untouched
    assert all(not node.core.request_ids() for node in cluster.nodes.values())
    # Freed when the abort or release arrived, not by the prefill node's hold timeout.
    assert cluster.nodes["prefill-0"].counters()["kv_hold_timeouts"] == 0
    # Held prompt blocks the proxy released (a done report frees them after a finished pull).
    assert cluster.nodes["prefill-0"].released_by_proxy == released


def test_abort_of_a_finished_request_is_refused():
    cluster, _ = run_abort_at(0.300)
    assert cluster.abort("r1") is False and cluster.abort("r0") is False
    assert cluster.requests_aborted == 1


# -- the serve driver wakes only the handlers whose request changed ------------------------
def test_the_paced_driver_wakes_only_touched_streams():
    from bench.serve.driver import PacedCluster
    from bench.serve.protocol import parse_request
    from bench.serve.tokenizer import get_tokenizer

    driver = PacedCluster(serve_spec(), max_pending=4)
    tok = get_tokenizer()

    def request(max_tokens: int):
        return parse_request({"prompt": "a b c", "max_tokens": max_tokens}, "completions", tok, "m", 4096)

    def at(t: float) -> None:  # the wall clock as if `t` modelled seconds had passed
        driver._start = driver._start - (t - driver.virtual_now())
        driver.advance()

    done = driver.submit(request(2))
    at(1.0)
    assert done.record.finish_reason == "length" and done.changed.is_set()
    done.changed.clear()
    busy = driver.submit(request(500))
    at(1.2)
    assert busy.changed.is_set() and len(busy.record.output_token_ids) > 0
    assert not done.changed.is_set()  # finished, not released: nothing new for its handler
    driver.release(done)
    driver.abort(busy)
    assert driver.in_flight == 0 and driver.cluster.requests_aborted == 1


# -- the Ray proxy's router, without Ray: abort messages and releases -----------------------
class _Router:
    """The proxy on wall-clock links, its sends recorded (ideal links deliver in the next loop pass)."""

    def __init__(self) -> None:
        from cluster.wall.clock import RunClock
        from cluster.wall.proxy_links import wall_proxy

        self.sent: list = []
        self.events: list = []
        spec = serve_spec(front_end={"preset": "off"})  # messages in the next loop pass, not after the API server
        self.proxy, self.links = wall_proxy(
            spec.proxy_settings(["prefill-0"], ["decode-0"]),
            spec.links.proxy.to_spec(),
            0,
            RunClock.starting_now(),
            lambda node, messages: self.sent.extend((node, m) for m in messages),
            self.events.extend,
        )

    def kinds(self) -> list[tuple[str, str, list[str]]]:
        return [(n, type(m).__name__, getattr(m, "request_ids", None) or [m.request_id]) for n, m in self.sent]


PARAMS = {"do_remote_prefill": True, "remote_block_ids": [1], "remote_address": "127.0.0.1:1"}


def _router_run(script) -> _Router:
    import asyncio

    async def body():
        h = _Router()
        await script(h, lambda: asyncio.sleep(0.01))
        h.links.close()
        return h

    return asyncio.run(asyncio.wait_for(body(), 10))


def test_router_abort_while_prefilling_aborts_there_and_releases_the_late_prompt():
    from proxy.client import Finished, Submission

    async def script(h, settle):
        h.proxy.submit([Submission("a", 40, 5)])
        await settle()
        assert h.proxy.abort("a") is True and h.proxy.abort("a") is False
        await settle()
        # The prompt finishes after the abort: the proxy releases it, no decode node hears of it.
        h.links.node_events("prefill-0", [["out", "a", [9], "length", PARAMS, 0, 0.001]])
        await settle()

    h = _router_run(script)
    assert h.kinds() == [
        ("prefill-0", "RequestMessage", ["a"]),
        ("prefill-0", "AbortMessage", ["a"]),
        ("prefill-0", "ReleaseMessage", ["a"]),
    ]
    fins = [e for e in h.events if isinstance(e, Finished)]
    assert [(e.request_id, e.reason, e.node) for e in fins] == [("a", "abort", "prefill-0")]
    assert h.proxy.requests_aborted == 1
    assert h.proxy.outstanding == {"prefill-0": 0, "decode-0": 0}


def test_router_abort_while_decoding_aborts_there_releases_the_prompt_and_drops_late_tokens():
    from proxy.client import Finished, Submission, Tokens

    async def script(h, settle):
        h.proxy.submit([Submission("a", 40, 50)])
        await settle()
        h.links.node_events("prefill-0", [["out", "a", [9], "length", PARAMS, 0, 0.001]])
        await settle()
        h.links.node_events("decode-0", [["out", "a", [5, 6], None, None, 0, 0.002]])
        await settle()
        assert h.proxy.abort("a") is True
        await settle()
        h.links.node_events("decode-0", [["out", "a", [7], None, None, 0, 0.002]])  # already on its way
        await settle()

    h = _router_run(script)
    assert h.kinds() == [
        ("prefill-0", "RequestMessage", ["a"]),
        ("decode-0", "RequestMessage", ["a"]),
        ("decode-0", "AbortMessage", ["a"]),
        ("prefill-0", "ReleaseMessage", ["a"]),
    ]
    assert [e.token_ids for e in h.events if isinstance(e, Tokens)] == [[5, 6]]
    assert [(e.reason, e.node) for e in h.events if isinstance(e, Finished)] == [("abort", "decode-0")]


def test_router_carries_the_clients_sampling_fields_to_both_nodes():
    from proxy.client import Submission

    async def script(h, settle):
        h.proxy.submit([Submission("a", 40, 8, 0, (), True, 3, (11, 12))])
        await settle()
        h.links.node_events("prefill-0", [["out", "a", [9], "length", PARAMS, 0, 0.001]])
        await settle()

    h = _router_run(script)
    for _, m in h.sent:
        assert (m.ignore_eos, m.min_tokens, m.stop_token_ids) == (True, 3, [11, 12])


# -- the abort message and the node's channel -------------------------------------------
def test_abort_message_on_the_wire_and_after_its_request_in_a_frame():
    from cluster.wall.proxy_channel import ProxyChannel
    from node.messages import AbortMessage, MessageError, RequestMessage, proxy_message_from_wire

    m = AbortMessage(["a", "b"])
    assert proxy_message_from_wire(m.to_wire()) == m
    with pytest.raises(MessageError, match="abort: request_ids must be a list"):
        proxy_message_from_wire(["abort", "a"])
    calls = []
    channel = ProxyChannel(
        "decode-0", lambda reqs: calls.append(("req", [r.request_id for r in reqs])), on_abort=calls.append
    )
    channel._on_frame(["req", [m.to_wire(), RequestMessage("c", 4, 2, 0.0).to_wire()]])
    assert calls == [("req", ["c"]), ["a", "b"]]


def test_a_node_counts_aborts_of_requests_its_engine_has():
    cluster = InProcCluster(serve_spec(), seed=0)
    cluster.submit([WorkloadRequest("r0", 0.0, 300, 50)])
    cluster.loop.advance_to(0.3)  # decoding at decode-0
    decode = cluster.nodes["decode-0"]
    decode.abort(["r0", "unknown"])
    cluster.loop.run()
    assert decode.counters()["requests_aborted"] == 1
    assert decode.core.end_of_run_errors() == []
