"""A `disagg-sim serve` on 127.0.0.1 in a background thread, per test module."""

from __future__ import annotations

import pytest

from bench.serve.server import ServerThread, build_app
from cluster.spec import ClusterSpec

MODEL = "sim-test"


def serve_spec(**overrides) -> ClusterSpec:
    """P/D, one node each, the synthetic 8B cost model (8 ms a step)."""
    base = {
        "prefill": {"count": 1, "engine": {"num_gpu_blocks": 2000, "max_model_len": 4096}},
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 2000, "max_model_len": 4096, "async_scheduling": True}},
        "links": {"kv": {"delay_ms": 1.0}},
        "cost_model": "synthetic-8b",
    }
    base.update(overrides)
    return ClusterSpec.model_validate(base)


def start_server(spec: ClusterSpec | None = None, **kwargs) -> ServerThread:
    return ServerThread(build_app(spec or serve_spec(), MODEL, **kwargs))


@pytest.fixture(scope="module")
def server():
    srv = start_server()
    yield srv
    srv.close()
