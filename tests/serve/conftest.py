"""`disagg-sim serve` on 127.0.0.1, on both runtimes: in-process in a
background thread (`ServerThread`), and on the session's loopback Ray
cluster with the front door in the proxy actor (`RayServer`). Both offer
`base_url`, `port`, `query(name, *args)` (`ServeDriver.query`) and `close`.

`server` is one per module and runtime; `start` builds more for a test
(e.g. another cluster spec), closed when the test ends."""

from __future__ import annotations

import time

import pytest

from bench.serve.server import ServerThread, build_app
from cluster.spec import ClusterSpec

MODEL = "sim-test"
RUNTIMES = ["inproc", pytest.param("ray", marks=pytest.mark.ray)]


def serve_spec(**overrides) -> ClusterSpec:
    """P/D, one node each, the synthetic 8B cost model (8 ms a step)."""
    base = {
        "prefill": {"count": 1, "engine": {"num_gpu_blocks": 2000, "max_model_len": 4096}},
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 2000, "max_model_len": 4096, "async_scheduling": True}},
        "links": {"kv": {"delay_ms": 1.0}},
        "cost_model": "synthetic-8b",
        # The server is these tests' subject, with timings pinned for a hand-off that costs only its
        # links (NIXL's first-contact handshake alone would be 2 s).
        "kv_transfer": {"preset": "none"},
    }
    base.update(overrides)
    return ClusterSpec.model_validate(base)


def start_server(spec: ClusterSpec | None = None, runtime: str = "inproc", ray_handle=None, **kwargs):
    spec = spec or serve_spec()
    if runtime == "ray":
        from bench.serve.ray_server import RayServer

        return RayServer(spec, ray_handle, MODEL, **kwargs)
    return ServerThread(build_app(spec, MODEL, **kwargs))


def _ray_handle(request, runtime: str):
    return request.getfixturevalue("ray_cluster") if runtime == "ray" else None


@pytest.fixture(scope="module", params=RUNTIMES)
def server(request):
    srv = start_server(runtime=request.param, ray_handle=_ray_handle(request, request.param))
    yield srv
    srv.close()


@pytest.fixture
def runtime(server):
    """The runtime of this test's `server`."""
    return "ray" if type(server).__name__ == "RayServer" else "inproc"


@pytest.fixture
def start(request, runtime):
    """Build another server on this test's runtime: `start(spec, **kwargs)`."""
    started = []

    def make(spec: ClusterSpec | None = None, **kwargs):
        srv = start_server(spec, runtime, _ray_handle(request, runtime), **kwargs)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.close()


def wait_idle(srv, deadline_s: float = 60.0) -> list[str]:
    """Polls until no node holds a request or a block it should not (no
    outcome depends on how long it takes); returns what is still held."""
    end = time.monotonic() + deadline_s
    while True:
        state = srv.query("engine_state")
        held = [e for s in state.values() for e in s["errors"]]
        held += [f"{n}: {s['requests']} request(s) in its scheduler" for n, s in state.items() if s["requests"]]
        if not held or time.monotonic() > end:
            return held
        time.sleep(0.05)
