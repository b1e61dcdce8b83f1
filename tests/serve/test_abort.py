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
