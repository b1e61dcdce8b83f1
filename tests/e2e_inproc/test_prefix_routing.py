"""Prefix-aware routing sends a request to the node the proxy sent the
longest prefix of its prompt to before: with two system prompts and two
nodes, each node ends up serving one prompt's users, and the cache hit rate
beats round-robin's (which sends every system prompt to both nodes)."""

from __future__ import annotations

from bench.workloads import generate_workload, parse_workload_spec
from cluster.inproc import run_inproc
from cluster.spec import ClusterSpec
from proxy.routing import PrefixIndex, Router

WORKLOAD = {
    "num_requests": 60,
    "prompt_len": 24,
    "output_len": 4,
    "shared_prefix": {"num_prefixes": 2, "prefix_len": 256, "assignment": "random"},
    "arrival": {"kind": "poisson", "rate": 50},
}


def hits_with(routing: str) -> tuple[int, int]:
    spec = ClusterSpec.model_validate(
        {"prefill": {"count": 0}, "decode": {"count": 2, "engine": {"num_gpu_blocks": 2000}}, "routing": routing}
    )
    result = run_inproc(spec, generate_workload(parse_workload_spec(WORKLOAD)), seed=0)
    assert result.invariant_errors == []
    c = result.counters()
    return c["prefix_cache_hits"], c["prefix_cache_queries"]


def test_prefix_aware_routing_hits_more_than_round_robin():
    aware, queries = hits_with("prefix_aware")
    blind, _ = hits_with("round_robin")
    assert aware > blind
    # Each system prompt is prefilled once in all: 58 of 60 requests hit its 16 blocks.
    assert aware == 58 * 256


def test_the_index_matches_leading_blocks_only_and_forgets_the_oldest():
    index: PrefixIndex[str] = PrefixIndex(capacity_blocks=3)
    index.record("a", [1, 2, 3])
    assert index.match("a", [1, 2, 9]) == 2 and index.match("a", [9, 1]) == 0 and index.match("b", [1]) == 0
    index.record("a", [4])  # over capacity: block 1, the least recently routed, goes
    assert index.match("a", [1, 2]) == 0 and index.match("a", [4]) == 1
    router = Router(["a", "b"], "prefix_aware", lambda n: 0, index)
    assert router.pick([4, 7]) == "a" and router.pick([8]) == "a"  # a tie goes to the earliest node
