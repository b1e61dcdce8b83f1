"""The P/D hand-off's timeline and the TTFT breakdown, pinned on a hand-built
1P1D in-process run with the `unit` cost model (a step: 1 ms + 0.01 ms per
token) and ideal links, so every term is a hand-computed time:

    proxy_prefill_request  10 ms (the prompt-only request)
    prefill                one step of 100 tokens: 1 + 100 x 0.01 = 2 ms
    proxy_decode_request   reply 20 ms + second request 30 ms = 50 ms
    transfer               handshake 500 ms (first contact only) + metadata 4 ms
                           + latency 2 ms + 7 blocks x (2 x 2 layers) descriptors
                           x 10 us = 0.28 ms + 100 tokens x 64 B at 1 MB/s = 6.4 ms
    first_decode_step      the first-token recompute: 1 + 0.01 x rows ms
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from cluster.inproc import InProcCluster, run_inproc
from cluster.kv_transfer import PRESETS, KVTransferSettings
from cluster.spec import ClusterSpec
from connector.kv_timing import KVContacts, KVTransferTiming
from engine.records import WorkloadRequest
from proxy.breakdown import PARTS, breakdown

TERMS = {
    "prefill_request_s": 0.010,
    "prefill_reply_s": 0.020,
    "decode_request_s": 0.030,
    "handshake_s": 0.5,
    "metadata_s": 0.004,
    "transfer_latency_s": 0.002,
    "descriptor_us": 10,
    "bandwidth_GBps": 0.001,
    "num_layers": 2,
}
TRANSFER_S = 0.004 + 0.002 + 7 * 4 * 10e-6 + 100 * 64 / 1e6  # without the handshake


def spec(front_end: dict | None = None, **kv) -> ClusterSpec:
    """1P1D on the unit cost model; the API server off unless `front_end` says."""
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": 1},
            "decode": {"count": 1},
            "cost_model": "unit",
            "kv_transfer": {**TERMS, **kv},
            "front_end": front_end or {"preset": "off"},
        }
    )


def run(s: ClusterSpec, workload: list[WorkloadRequest]):
    c = InProcCluster(s, seed=0)
    c.submit(workload)
    result = c.run()
    assert result.invariant_errors == []
    return {r.request_id: r for r in result.requests}


def parts_of(rec) -> dict[str, float]:
    assert rec.ttft_breakdown is not None and list(rec.ttft_breakdown) == list(PARTS)
    return rec.ttft_breakdown


def test_every_term_of_a_hand_off_at_its_hand_computed_time():
    reqs = run(spec(), [WorkloadRequest("r0", 0.0, 100, 4), WorkloadRequest("r2", 1.0, 100, 4)])
    first, later = parts_of(reqs["r0"]), parts_of(reqs["r2"])
    for p in (first, later):
        assert p["front_end"] == 0.0 and p["to_client"] == 0.0  # the API server is off here
        assert p["proxy_prefill_request"] == pytest.approx(0.010, abs=1e-12)
        assert p["queue"] == pytest.approx(0.0, abs=1e-12)
        assert p["prefill"] == pytest.approx(0.002, abs=1e-12)
        assert p["proxy_decode_request"] == pytest.approx(0.050, abs=1e-12)
        assert p["decode_queue"] == pytest.approx(0.0, abs=1e-12)  # an idle decode node starts the load at once
        assert p["decode_admission"] == pytest.approx(0.0, abs=1e-12)  # and schedules it the moment it lands
        assert p["first_decode_step"] == pytest.approx(0.00101, abs=1e-12)  # the recompute step, one row
    # The handshake is paid on first contact only.
    assert first["transfer"] == pytest.approx(0.5 + TRANSFER_S, abs=1e-12)
    assert later["transfer"] == pytest.approx(TRANSFER_S, abs=1e-12)
    assert reqs["r2"].ttft == pytest.approx(0.010 + 0.002 + 0.050 + TRANSFER_S + 0.00101, abs=1e-12)


def test_the_api_server_serves_requests_in_turn_before_the_proxy_routes_them():
    # 2 ms a request + 10 us a prompt token = 3 ms of API-server work each,
    # then 5 ms of IPC: "a" is routed at 8 ms, "b" (same arrival) waits for
    # "a"'s tokenization: 11 ms; "c" arrives to an idle server: 8 ms.
    fe = {"preset": "off", "request_ms": 2.0, "prompt_token_us": 10.0, "ipc_ms": 5.0}
    reqs = run(
        spec(front_end=fe),
        [WorkloadRequest("a", 0.0, 100, 4), WorkloadRequest("b", 0.0, 100, 4), WorkloadRequest("c", 1.0, 100, 4)],
    )
    assert parts_of(reqs["a"])["front_end"] == pytest.approx(0.008, abs=1e-12)
    assert parts_of(reqs["b"])["front_end"] == pytest.approx(0.011, abs=1e-12)
    assert parts_of(reqs["c"])["front_end"] == pytest.approx(0.008, abs=1e-12)
    for r in reqs.values():
        # The first token crosses back to the API server (5 ms of IPC) and is
        # streamed at no cost (output_token_us 0): `to_client` is the IPC.
        assert parts_of(r)["to_client"] == pytest.approx(0.005, abs=1e-12)
        assert math.fsum(parts_of(r).values()) == pytest.approx(r.ttft, abs=1e-9)


def test_a_request_waits_out_a_handshake_in_progress():
    # r1 reaches the decode node at 0.162 s, while r0's handshake runs until
    # 0.562 s: its read starts then (after its own metadata), with r0's.
    reqs = run(spec(), [WorkloadRequest("r0", 0.0, 100, 4), WorkloadRequest("r1", 0.1, 100, 4)])
    assert parts_of(reqs["r1"])["transfer"] == pytest.approx(0.562 - 0.162 + TRANSFER_S, abs=1e-12)
    assert reqs["r0"].remote_kv_wait_end == pytest.approx(reqs["r1"].remote_kv_wait_end, abs=1e-12)
    # Both enter the same first decode step: two rows.
    assert parts_of(reqs["r1"])["first_decode_step"] == pytest.approx(0.00102, abs=1e-12)


def test_block_size_sets_the_descriptor_count():
    s16 = spec(preset="none", descriptor_us=1000, bandwidth_GBps=None, handshake_s=0)
    s64 = s16.model_copy(deep=True)
    for g in (s64.prefill, s64.decode):
        g.engine.block_size = 64
    # 100 tokens: 7 blocks of 16 or 2 of 64, 4 descriptors each, 1 ms apiece
    # (bandwidth null: the preset's, and `none` has none).
    bytes_s = 0.0
    t16 = parts_of(run(s16, [WorkloadRequest("r", 0.0, 100, 2)])["r"])["transfer"]
    t64 = parts_of(run(s64, [WorkloadRequest("r", 0.0, 100, 2)])["r"])["transfer"]
    assert t16 == pytest.approx(0.004 + 0.002 + 28 * 0.001 + bytes_s, abs=1e-12)
    assert t64 == pytest.approx(0.004 + 0.002 + 8 * 0.001 + bytes_s, abs=1e-12)


def test_tp_layouts_that_differ_multiply_the_reads():
    s = KVTransferSettings(preset="nixl", prefill_tp=4, decode_tp=2)
    assert s.timing(32, 1).descriptors_per_block == 2 * 32 * 2  # each decode rank reads from 2 prefill ranks
    assert KVTransferSettings(preset="nixl", prefill_tp=2, decode_tp=4).timing(32, 1).descriptors_per_block == 64
    assert KVTransferSettings(preset="nixl").timing(80, 8).descriptors_per_block == 160  # the same layout


def test_the_nixl_preset_reproduces_the_rfc_window():
    # vLLM RFC #50913: a ~5k-token pull at block size 16 takes ~105 ms, at 64 ~58 ms less
    # (an 8B-class model: 32 layers, 131,072 B of K/V per token).
    t = KVTransferSettings(preset="nixl").timing(32, 1)
    w16 = t.transfer_s(math.ceil(5000 / 16), 5000 * 131072)
    w64 = t.transfer_s(math.ceil(5000 / 64), 5000 * 131072)
    assert w16 == pytest.approx(0.105, abs=0.003)
    assert w16 - w64 == pytest.approx(0.058, abs=0.002)
    assert PRESETS["nixl"]["handshake_s"] == 2.0  # "the nixl handshake takes ~2s" (neuralmagic/vllm PR #63)


def test_p2pnccl_costs_about_30_ms_per_10k_tokens():
    # vLLM PR #18242: "~30ms overhead for 10000 tokens" (Llama-3.1-8B: 131,072 B per token).
    t = KVTransferSettings(preset="p2pnccl").timing(32, 1)
    assert t.transfer_s(625, 10_000 * 131072) == pytest.approx(0.030, abs=0.001)


def test_contacts_shake_hands_once_per_peer_and_send_metadata_once_per_request():
    t = KVTransferTiming(handshake_s=1.0, metadata_s=0.1)
    c = KVContacts()
    assert c.start_at(t, "p0", "a", 0.0) == pytest.approx(1.1)
    assert c.start_at(t, "p0", "a", 2.0) == pytest.approx(2.0)  # a retry: no metadata again
    assert c.start_at(t, "p0", "b", 0.5) == pytest.approx(1.1)  # the handshake in progress is waited for
    assert c.start_at(t, "p1", "c", 3.0) == pytest.approx(4.1)  # another peer: its own handshake


def test_the_parts_add_up_to_every_ttft_under_load():
    s = ClusterSpec.model_validate(
        {
            "prefill": {"count": 2},
            "decode": {"count": 2, "engine": {"num_gpu_blocks": 200, "async_scheduling": True}},
            "cost_model": "llama-3.1-8b-h100",
            "kv_transfer": {"preset": "nixl"},
            "links": {"kv": {"delay_ms": 1.0, "jitter_ms": 0.2}, "proxy": {"delay_ms": 0.5}},
        }
    )
    wl = [WorkloadRequest(f"r{i:02d}", 0.01 * i, 200 + 37 * i, 30) for i in range(40)]
    result = run_inproc(s, wl, seed=1)
    assert result.invariant_errors == []
    for r in result.requests:
        p = parts_of(r)
        assert math.fsum(p.values()) == pytest.approx(r.ttft, abs=1e-9), r.request_id
        assert all(v >= -1e-12 for v in p.values()), (r.request_id, p)


def test_an_aggregated_request_is_queue_and_prefill():
    s = ClusterSpec.model_validate(
        {
            "prefill": {"count": 0},
            "decode": {"count": 1},
            "cost_model": "unit",
            "kv_transfer": {"preset": "nixl"},
            "front_end": {"preset": "off"},
        }
    )
    reqs = run(s, [WorkloadRequest("a", 0.0, 100, 3), WorkloadRequest("b", 0.0, 100, 3)])
    p = parts_of(reqs["b"])
    assert p["prefill"] == pytest.approx(0.001 + 200 * 0.00001, abs=1e-12)  # one step of both prompts
    assert {k for k, v in p.items() if v} == {"prefill"}  # no hand-off legs without prefill nodes


def test_a_request_aborted_during_a_proxy_leg_is_never_routed():
    c = InProcCluster(spec(prefill_request_s=0.5), seed=0)
    c.submit([WorkloadRequest("r0", 0.0, 100, 4)])
    c.loop.at(0.1, c.proxy.abort, "r0")
    result = c.run()
    assert result.invariant_errors == []
    assert result.requests[0].finish_reason == "abort"
    assert c.proxy.routed["prefill-0"] == 0


def test_breakdown_telescopes_over_missing_moments():
    parts = breakdown(1.0, {"queue": 1.5, "prefill": 2.0}, 2.25)
    assert parts["queue"] == 0.5 and parts["prefill"] == 0.5 and parts["to_client"] == 0.25
    assert sum(parts.values()) == 1.25


@pytest.mark.parametrize(
    ("kv", "words"),
    [
        ({"preset": "nvlink"}, ["preset", "nixl", "mooncake"]),
        ({"handshake_s": -1}, ["handshake_s", "greater than or equal to 0"]),
        ({"bandwidth_GBps": 0}, ["bandwidth_GBps"]),
        ({"handshak_s": 1}, ["handshak_s"]),
    ],
)
def test_bad_settings_name_the_field(kv, words):
    with pytest.raises(ValidationError) as err:
        ClusterSpec.model_validate({"kv_transfer": kv})
    for w in words:
        assert w in str(err.value)
