"""Each routing policy in a run (proxy/routing.py): 2 prefill and 3 decode
nodes, a pool's policy set on its own, four system prompts shared by the
users. Every request finishes; where the proxy sent them is what the
policy says."""

from __future__ import annotations

import pytest

from bench.workloads import generate_workload, parse_workload_spec
from cluster.inproc import InProcCluster
from cluster.spec import ClusterSpec

WORKLOAD = {
    "num_requests": 60,
    "prompt_len": 32,
    "output_len": 6,
    "shared_prefix": {"num_prefixes": 4, "prefix_len": 128, "assignment": "random"},
    "arrival": {"kind": "poisson", "rate": 40},
}


def run(prefill: str, decode: str, **cluster: object) -> tuple[InProcCluster, dict[str, float]]:
    engine = {"num_gpu_blocks": 400, "enable_prefix_caching": True}
    spec = ClusterSpec.model_validate(
        {
            "prefill": {"count": 2, "engine": engine, "routing": prefill},
            "decode": {"count": 3, "engine": engine, "routing": decode},
            # A free hand-off: under NIXL's (the default) every request of this 1.5 s
            # burst is still loading when the 2 s first-contact handshake ends, so
            # no decode block is cached yet and the routers could not differ by hits.
            "kv_transfer": {"preset": "none"},
            **cluster,
        }
    )
    c = InProcCluster(spec, seed=0)
    c.submit(generate_workload(parse_workload_spec(WORKLOAD)))
    result = c.run()
    assert result.invariant_errors == []
    assert all(r.finish_reason in ("stop", "length") for r in result.requests)
    return c, result.counters_for("decode")


def routed(c: InProcCluster, role: str) -> list[int]:
    return [n for name, n in c.proxy.routed.items() if name.startswith(role)]


def test_round_robin_spreads_both_pools_evenly():
    c, _ = run("round_robin", "round_robin")
    assert routed(c, "prefill") == [30, 30] and routed(c, "decode") == [20, 20, 20]


def test_least_loaded_uses_every_node():
    c, _ = run("least_loaded", "least_loaded")
    assert sum(routed(c, "prefill")) == 60 and sum(routed(c, "decode")) == 60
    assert min(routed(c, "prefill")) > 0 and min(routed(c, "decode")) > 0


def test_prefix_aware_decode_pool_sends_each_system_prompt_to_one_node():
    c, decode = run("round_robin", "prefix_aware")
    assert routed(c, "prefill") == [30, 30]  # the prefill pool keeps its own policy
    # Each of the 4 system prompts (8 blocks) is computed once on the decode pool: every other request hits.
    assert decode["prefix_cache_hits"] == (60 - 4) * 128


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_kv_aware_hits_more_than_round_robin_and_spreads_load(pool):
    policies = {"prefill": "round_robin", "decode": "round_robin"}
    _, blind = run(**policies)
    c, aware = run(**{**policies, pool: "kv_aware"})
    counters = c.proxy.routed
    hits = {"decode": lambda: aware["prefix_cache_hits"], "prefill": lambda: prefill_hits(c)}[pool]()
    base = {"decode": lambda: blind["prefix_cache_hits"], "prefill": lambda: prefill_hits_of(policies)}[pool]()
    assert hits > base
    # The queue and KV-usage scores keep one node from taking every request.
    assert min(n for name, n in counters.items() if name.startswith(pool)) > 0


def prefill_hits(c: InProcCluster) -> int:
    return sum(int(n.counters()["prefix_cache_hits"]) for n in c.prefill_nodes)


def prefill_hits_of(policies: dict[str, str]) -> int:
    c, _ = run(**policies)
    return prefill_hits(c)


def test_kv_aware_with_only_the_prefix_weight_acts_as_prefix_aware():
    weights = {"prefix": 1.0, "queue": 0.0, "kv_usage": 0.0}
    c, decode = run("round_robin", "kv_aware", routing_weights=weights)
    assert decode["prefix_cache_hits"] == (60 - 4) * 128


def test_an_unknown_pool_policy_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match="(?s)decode.routing.*'kv_aware'"):
        ClusterSpec.model_validate({"decode": {"routing": "random"}})


def test_routing_weights_all_zero_are_refused():
    allowed = "allowed: at least one of prefix, queue, kv_usage > 0"
    with pytest.raises(ValueError, match=f"routing_weights are all 0.*{allowed}"):
        ClusterSpec.model_validate({"routing_weights": {"prefix": 0, "queue": 0, "kv_usage": 0}})
