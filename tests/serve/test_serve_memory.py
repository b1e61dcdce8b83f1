"""A long-lived server's memory is flat (issue 34, finding 6: 85 -> 114 MB
over 32k requests): the paced driver trims the cluster's history every
`TRIM_EVERY` requests (`InProcCluster.trim_history`), so step records, first
scheduled times, the shadow store's bookkeeping and done reports stay
bounded, and finished records are a ring. Results are unchanged by it."""

from __future__ import annotations

from bench.serve.driver import KEEP_STEPS, TRIM_EVERY, PacedCluster
from bench.serve.protocol import parse_request
from bench.serve.tokenizer import get_tokenizer

from .conftest import serve_spec


def test_the_paced_cluster_keeps_a_bounded_history():
    driver = PacedCluster(serve_spec(), max_pending=64, keep_records=100)
    tok = get_tokenizer()
    req = parse_request({"prompt": "a b c d", "max_tokens": 12, "ignore_eos": True}, "completions", tok, "m", 4096)
    clock = 0.0

    def at(t: float) -> None:  # the wall clock as if `t` modelled seconds had passed
        driver._start = driver._start - (t - driver.virtual_now())
        driver.advance()

    n = 4 * TRIM_EVERY
    for _ in range(n // 32):
        streams = [driver.submit(req) for _ in range(32)]
        while any(s.record.finish_reason is None for s in streams):
            clock += 0.05
            at(clock)
        assert [(s.record.finish_reason, len(s.record.output_token_ids)) for s in streams] == [("length", 12)] * 32
        for s in streams:
            driver.release(s)
    cluster = driver.cluster
    assert len(driver.finished) == 100 and driver.in_flight == 0
    assert len(cluster.records) == 0 and not cluster.proxy.requests
    for name, node in cluster.nodes.items():
        engine = node.core.engine
        # n is a multiple of TRIM_EVERY: the last release trimmed; at most the
        # last batch of 32 is left in any per-request map.
        assert len(engine.step_records) == KEEP_STEPS, name
        assert len(engine.first_scheduled) <= 32, name
        shadow = node.core.runner.shadow
        assert shadow is not None
        assert len(shadow._retired) + len(shadow._bad) + len(shadow._verified) <= 32, name
        assert node.core.end_of_run_errors() == [], name
    kv = cluster.nodes["decode-0"].kv
    assert len(kv._reported) <= 32
