"""The API server's token side on the in-process runtime (engine/front_end.py
`OutputStream`): each batch of a node's outputs crosses back (IPC), waits for
the batches before it, and is streamed at `output_token_us` per token; the
client's token times, finish and TTFT breakdown are those, hand-computed on
the `unit` cost model (a step: 1 ms + 0.01 ms per token) with ideal links.

Two requests of 100-token prompts and 3 output tokens each at t=0, one
decode node, the API server costing nothing per request, 2 ms of IPC each
way and 1 ms per output token (slower than a decode step, so batches queue):

    routed                 0 + 2 ms IPC                          = 2 ms
    step 1 (both prompts)  2 + 1 + 200 x 0.01  -> ends 5 ms;    seen max(5 + 2, 0)     + 2 x 1 = 9 ms
    step 2 (2 decode rows) 5 + 1 + 2 x 0.01    -> ends 6.02 ms; seen max(8.02, 9)      + 2     = 11 ms
    step 3                 6.02 + 1.02         -> ends 7.04 ms; seen max(9.04, 11)     + 2     = 13 ms
"""

from __future__ import annotations

import math

import pytest

from cluster.inproc import InProcCluster
from cluster.spec import ClusterSpec
from engine import fast_paths
from engine.records import WorkloadRequest

FRONT_END = {"preset": "off", "ipc_ms": 2.0, "output_token_us": 1000.0}


def _run(front_end: dict, output_len: int = 3, fast: bool = True):
    spec = ClusterSpec.model_validate(
        {"prefill": {"count": 0}, "decode": {"count": 1}, "cost_model": "unit", "front_end": front_end}
    )
    previous = fast_paths.set_enabled(fast)
    try:
        c = InProcCluster(spec, seed=0)
        c.submit([WorkloadRequest("a", 0.0, 100, output_len), WorkloadRequest("b", 0.0, 100, output_len)])
        result = c.run()
    finally:
        fast_paths.set_enabled(previous)
    assert result.invariant_errors == []
    return {r.request_id: r for r in result.requests}


def test_each_batch_is_streamed_after_the_ones_before_it():
    reqs = _run(FRONT_END)
    for r in reqs.values():
        assert r.token_times == pytest.approx([0.009, 0.011, 0.013], abs=1e-12)
        assert r.finish_time == pytest.approx(0.013, abs=1e-12)  # the finish rides the last chunk
        parts = r.ttft_breakdown
        assert parts is not None
        assert parts["front_end"] == pytest.approx(0.002, abs=1e-12)
        assert parts["prefill"] == pytest.approx(0.003, abs=1e-12)  # the proxy has the token at 5 ms
        assert parts["to_client"] == pytest.approx(0.004, abs=1e-12)  # 2 ms IPC + the batch's 2 ms of streaming
        assert math.fsum(parts.values()) == pytest.approx(r.ttft, abs=1e-12)


def test_the_stream_moves_token_times_by_what_it_costs_and_nothing_else():
    off = _run({"preset": "off"})
    # Without it the engine has the requests at once and the client sees each
    # token when the proxy has it: the steps' ends.
    assert off["a"].token_times == pytest.approx([0.003, 0.00402, 0.00504], abs=1e-12)
    # IPC alone (no streaming cost) shifts the tokens by the two hops, the
    # request's on the way in and the tokens' on the way out.
    ipc = _run({"preset": "off", "ipc_ms": 2.0})
    assert ipc["a"].token_times == pytest.approx([t + 0.004 for t in off["a"].token_times], abs=1e-12)
    assert ipc["a"].ttft_breakdown is not None and ipc["a"].ttft_breakdown["to_client"] == pytest.approx(0.002)


@pytest.mark.parametrize("output_len", [3, 40])
def test_the_fast_paths_stream_the_same(output_len):
    # 40 tokens: the steady-decode fast-forward carries most steps, whose
    # client times are computed at the forward's first receipt.
    plain, fast = _run(FRONT_END, output_len, fast=False), _run(FRONT_END, output_len, fast=True)
    for rid in plain:
        assert fast[rid].token_times == plain[rid].token_times
        assert fast[rid].finish_time == plain[rid].finish_time
        assert fast[rid].ttft_breakdown == plain[rid].ttft_breakdown
    # Steady state: each 2-token batch takes 2 ms to stream, longer than a
    # 1.02 ms step, so the client sees one every 2 ms.
    times = plain["a"].token_times
    assert [round(b - a, 9) for a, b in zip(times, times[1:])] == [0.002] * (output_len - 1)


def test_a_rerouted_stream_never_shows_a_token_before_the_last_one_it_showed():
    # 20 ms per token: decode-0's API server falls ~39 ms further behind at each
    # ~1 ms step of its two requests. Killed at 0.1 s, its requests go on at
    # decode-1, whose server is idle (its requests finished): their new tokens
    # would reach the client seconds before the ones decode-0's server streams
    # last, so each is held to the last one the client saw.
    spec = ClusterSpec.model_validate(
        {
            "prefill": {"count": 0},
            "decode": {"count": 2},
            "cost_model": "unit",
            "routing": "round_robin",
            "front_end": {"preset": "off", "output_token_us": 20_000.0},
        }
    )
    c = InProcCluster(spec, seed=0)
    c.submit([WorkloadRequest(f"r{i}", 0.0, 16, 400 if i % 2 == 0 else 2) for i in range(4)])
    c.kill_node_at("decode-0", 0.1)
    result = c.run()
    assert result.invariant_errors == []  # token times in order among them
    assert result.extra["rerouted"] == {"r0": 1, "r2": 1}
    for rid in ("r0", "r2"):
        (rec,) = [r for r in result.requests if r.request_id == rid]
        assert rec.finish_reason == "length" and len(rec.token_times) == 400
        times = rec.token_times
        # The tokens decode-0 streamed, then decode-1's first ones held at the last of them.
        held = [i for i in range(1, len(times)) if times[i] == times[i - 1]]
        assert held, "the re-routed stream was never held back"
        assert times == sorted(times)
