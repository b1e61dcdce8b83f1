"""Each routing policy's exact choices (proxy/routing.py): the router built
by hand, fed node states, the node it picks asserted."""

from __future__ import annotations

import pytest

from proxy.routing import PrefixIndex, Router, ScoreWeights

NODES = ["n0", "n1", "n2"]


def loads(**q: int) -> dict[str, int]:
    return {n: q.get(n, 0) for n in NODES}


def test_round_robin_takes_the_nodes_in_turn_whatever_their_load():
    state = loads(n0=9)
    router = Router(NODES, "round_robin", state.__getitem__)
    assert [router.pick() for _ in range(5)] == ["n0", "n1", "n2", "n0", "n1"]


def test_least_loaded_takes_the_fewest_outstanding_ties_to_the_earliest():
    state = loads(n0=3, n1=1, n2=1)
    router = Router(NODES, "least_loaded", state.__getitem__)
    assert router.pick() == "n1"
    state["n1"] = 2
    assert router.pick() == "n2"
    state.update(n0=0)
    assert router.pick() == "n0"


def test_prefix_aware_takes_the_longest_routed_prefix_then_the_least_loaded():
    state = loads(n0=5, n1=0, n2=0)
    index: PrefixIndex[str] = PrefixIndex()
    index.record("n0", [1, 2, 3])
    index.record("n2", [1, 2])
    router = Router(NODES, "prefix_aware", state.__getitem__, index)
    assert router.pick([1, 2, 3, 4]) == "n0"  # 3 blocks beat 2, however loaded
    assert router.pick([1, 2, 9]) == "n2"  # n0 and n2 both match 2 blocks: the less loaded
    assert router.pick([7]) == "n1"  # no match anywhere: the least loaded, earliest of the ties
    # What was routed is remembered: [7] went to n1.
    assert index.match("n1", [7, 8]) == 1


def test_prefix_aware_ties_on_the_prefix_go_to_the_least_loaded():
    state = loads(n0=4, n1=2, n2=3)
    index: PrefixIndex[str] = PrefixIndex()
    for n in NODES:
        index.record(n, [1, 2])
    router = Router(NODES, "prefix_aware", state.__getitem__, index)
    assert router.pick([1, 2, 3]) == "n1"


def test_kv_aware_scores_are_the_weighted_prefix_queue_and_kv_usage_scores():
    state = loads(n0=4, n1=0, n2=2)
    usage = {"n0": 0.5, "n1": 0.9, "n2": 0.0}
    index: PrefixIndex[str] = PrefixIndex()
    index.record("n0", [1, 2, 3, 4])
    index.record("n2", [1])
    router = Router(NODES, "kv_aware", state.__getitem__, index, usage.__getitem__, ScoreWeights(3, 2, 2))
    # prefix: n0 4/4, n1 0, n2 1/4; queue (min-max over 0..4): n0 0, n1 1, n2 0.5; kv: 0.5, 0.1, 1.0
    assert router.scores([1, 2, 3, 4]) == pytest.approx([3 * 1 + 0 + 2 * 0.5, 0 + 2 + 2 * 0.1, 0.75 + 1 + 2])


def test_kv_aware_picks_the_highest_score():
    state = loads(n0=4, n1=0, n2=2)
    usage = {"n0": 0.5, "n1": 0.9, "n2": 0.0}
    index: PrefixIndex[str] = PrefixIndex()
    index.record("n0", [1, 2, 3, 4])
    index.record("n2", [1])
    router = Router(NODES, "kv_aware", state.__getitem__, index, usage.__getitem__, ScoreWeights(3, 2, 2))
    # Scores 4.0, 2.2, 3.75: the full prefix wins.
    assert router.pick([1, 2, 3, 4]) == "n0"
    # Without the prefix weight, n2's empty cache and middling queue win.
    router.weights = ScoreWeights(0, 2, 2)
    assert router.scores([1, 2, 3, 4]) == pytest.approx([1.0, 2.2, 3.0])
    assert router.pick([1, 2, 3, 4]) == "n2"
    # Only the queue counts: the emptiest queue.
    router.weights = ScoreWeights(0, 1, 0)
    assert router.pick([1, 2, 3, 4]) == "n1"


def test_kv_aware_ties_go_to_the_earliest_node_and_what_it_routed_is_indexed():
    state = loads()
    router = Router(NODES, "kv_aware", state.__getitem__)
    # Equal queues score 1 each, no usage known, no prefix: all tie.
    assert router.scores([5, 6]) == [2.0 + 2.0] * 3
    assert router.pick([5, 6]) == "n0"
    state["n0"] = 1
    # n0 holds [5, 6] (prefix 3) but has the fullest queue (0): 3 + 0 + 2 = 5 beats 0 + 2 + 2.
    assert router.scores([5, 6]) == [5.0, 4.0, 4.0]
    assert router.pick([5, 6]) == "n0"
    assert router.pick([8]) == "n1"  # no prefix anywhere: the emptiest queues tie, the earliest wins


def test_kv_usage_is_clipped_to_a_fraction():
    state = loads()
    usage = {"n0": 1.7, "n1": -0.2, "n2": 0.25}
    router = Router(NODES, "kv_aware", state.__getitem__, kv_usage=usage.__getitem__, weights=ScoreWeights(0, 0, 1))
    assert router.scores([]) == [0.0, 1.0, 0.75]
    assert router.pick() == "n1"


def test_an_unknown_policy_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: round_robin, least_loaded, prefix_aware, kv_aware"):
        Router(NODES, "random", lambda n: 0)
