"""On the virtual clock too, only the consumer a request was routed to may
pull it or report on it: an intruder without the ticket is refused (pull
and done report), the ticket binds the request to its first consumer, and
the run the intruder tried to disturb still ends clean."""

from __future__ import annotations

from cluster.inproc import InProcCluster
from cluster.inproc.kv_transport import InProcKVTransport
from connector.transport import DoneReport, PullAttempt, PullFailure
from node.access import TICKET_PARAM
from tests.e2e_ray.conftest import make_spec, workload


def test_an_intruder_cannot_pull_or_report_and_the_run_ends_clean():
    spec = make_spec(links={"kv": {"delay_ms": 5.0}}, time_scale=1.0)
    cluster = InProcCluster(spec, seed=0)
    cluster.submit(workload(4, 64, 8))
    prefill = cluster.nodes["prefill-0"]
    tickets: dict[str, str] = {}
    emit = prefill._emit

    def spy(events):  # the tickets the proxy sees (and only the routed decode node gets)
        for ev in events:
            params = getattr(ev, "kv_transfer_params", None)
            if params and TICKET_PARAM in params:
                tickets[ev.request_id] = params[TICKET_PARAM]
        emit(events)

    prefill._emit = spy
    t = 0.0
    while not prefill._held:
        t += 0.001
        cluster.loop.run(until=t)
    rid = next(iter(prefill._held))
    intruder = InProcKVTransport("intruder", cluster.loop, cluster._producers, cluster._kv_link, 64)
    results: list = []
    for ticket in ("", "0" * 32, tickets[rid]):
        attempt = PullAttempt(rid, rid, "prefill-0", (0,), (0,), (0,), 64, 1, 1.0, "intruder", ticket)
        intruder.pull(attempt, lambda *a: None, results.append)
    intruder.report_done(DoneReport(rid, "prefill-0", True, 1, 1.0, "intruder", ticket=""), results.append)
    result = cluster.run()

    pulls, done = results[:3], results[3]
    assert [r.failure for r in pulls[:2]] == [PullFailure.REJECTED, PullFailure.REJECTED]
    # even with the ticket (stolen from the proxy), the request is bound to decode-0 or soon will be
    assert pulls[2].failure in (None, PullFailure.REJECTED)
    assert (done.delivered, done.final) == (False, True)
    assert result.invariant_errors == []
    assert {r.finish_reason for r in result.requests} == {"length"}
    assert result.node_counters["prefill-0"]["kv_access_denied"] >= 3
    assert result.node_counters["prefill-0"]["kv_hold_timeouts"] == 0
