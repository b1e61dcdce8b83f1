"""The API server's token side on Ray (engine/front_end.py `OutputStream`,
applied by the proxy actor): the client's token times include the IPC back
and each batch's detokenize+SSE, queued behind the node's earlier batches.

Wall time only adds to modelled terms, so the bounds hold on a loaded
machine; the first request's first batch meets an idle API server, so its
`to_client` is the modelled cost exactly (to the wall clock's microseconds).
"""

from __future__ import annotations

import pytest

from bench.wall_twin import to_model_time
from cluster.ray.runtime import run_ray

from .conftest import make_spec, workload

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

IPC_S, TOKEN_S = 0.030, 0.005  # 30 ms each way, 5 ms per output token


def test_client_token_times_include_the_api_servers_streaming(ray_cluster):
    spec = make_spec(
        prefill={"count": 0},
        decode={"count": 1, "engine": {"num_gpu_blocks": 1000}},
        front_end={"preset": "off", "ipc_ms": IPC_S * 1e3, "output_token_us": TOKEN_S * 1e6},
    )
    wall = run_ray(spec, workload(3, 64, 8, gap_s=0.2), seed=1, handle=ray_cluster, timeout_s=60)
    run = to_model_time(wall)
    assert run.invariant_errors == []
    assert [r.finish_reason for r in run.requests] == ["length"] * 3
    first = min(run.requests, key=lambda r: r.arrival_time)
    assert first.ttft_breakdown is not None
    # Requests 0.2 s apart: the first one's first token is a batch of its own at an idle server.
    assert first.ttft_breakdown["to_client"] == pytest.approx(IPC_S + TOKEN_S, abs=1e-5)
    for r in run.requests:
        parts = r.ttft_breakdown
        assert parts is not None and abs(sum(parts.values()) - r.ttft) <= 1e-6
        # Both IPC hops and at least its own token's streaming, whatever the wall clock added.
        assert parts["front_end"] >= IPC_S - 1e-6 and parts["to_client"] >= IPC_S + TOKEN_S - 1e-6
        # Every token after the first is streamed after it, in turn (however the node's
        # outputs were batched): the client's decode span is at least their streaming.
        assert r.token_times[-1] - r.token_times[0] >= (len(r.token_times) - 1) * TOKEN_S - 1e-6
        assert r.finish_time == pytest.approx(r.token_times[-1], abs=1e-9)
