"""`cluster.placement` (cluster/placement_spec.py) and the Ray options it
gives each node actor (cluster/ray/placement.py), without a cluster."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import cluster.ray.env  # noqa: F401  (before ray)
from cluster.placement_spec import PlacementSpec
from cluster.ray.placement import describe_placement, node_actor_options
from cluster.spec import ClusterSpec

DRIVER = "ab" * 28  # a Ray node id: 28 bytes, hex
ROLES = {"disagg_prefill": 64.0, "disagg_decode": 64.0}


def _spec(**placement) -> PlacementSpec:
    return ClusterSpec.model_validate({"placement": placement}).placement


def test_the_default_keeps_the_role_resources_or_spreads():
    assert node_actor_options("decode", ROLES, _spec(), DRIVER) == {"num_cpus": 0, "resources": {"disagg_decode": 1}}
    assert node_actor_options("decode", {}, _spec(), DRIVER) == {"num_cpus": 0, "scheduling_strategy": "SPREAD"}
    assert describe_placement({}, _spec()) == "SPREAD (no disagg_* resources advertised)"


def test_spread_and_pack_override_the_role_resources():
    assert node_actor_options("prefill", ROLES, _spec(strategy="spread"), DRIVER)["scheduling_strategy"] == "SPREAD"
    packed = node_actor_options("prefill", ROLES, _spec(strategy="pack"), DRIVER)["scheduling_strategy"]
    assert (packed.node_id, packed.soft) == (DRIVER, False)
    assert describe_placement(ROLES, _spec(strategy="pack")).startswith("pack: every node on the driver's Ray node")


def test_a_groups_own_resources_win_and_must_be_advertised():
    placement = _spec(strategy="spread", decode={"resources": {"host_b": 1}})
    assert node_actor_options("decode", {"host_b": 2.0}, placement, DRIVER) == {
        "num_cpus": 0,
        "resources": {"host_b": 1.0},
    }
    assert node_actor_options("prefill", {"host_b": 2.0}, placement, DRIVER)["scheduling_strategy"] == "SPREAD"
    with pytest.raises(ValueError, match=r"cluster.placement.decode.resources: host_b not advertised by any Ray node"):
        node_actor_options("decode", ROLES, placement, DRIVER)


@pytest.mark.parametrize(
    "placement,message",
    [
        ({"strategy": "scatter"}, "Input should be 'auto', 'spread' or 'pack'"),
        ({"decode": {"resources": {"CPU": 1}}}, "resource 'CPU' is invalid; allowed: a custom resource name"),
        ({"decode": {"resources": {"a b": 1}}}, "resource 'a b' is invalid"),
        ({"prefill": {"resources": {"host": 0}}}, "resource host=0.0 is invalid; allowed: an amount in (0, 10000]"),
        ({"prefill": {"labels": {"zone": "a"}}}, "Extra inputs are not permitted"),
    ],
)
def test_bad_placement_is_refused_naming_what_is_allowed(placement, message):
    with pytest.raises(ValidationError) as info:
        ClusterSpec.model_validate({"placement": placement})
    assert message in str(info.value)


def test_tls_is_auto_on_or_off():
    assert ClusterSpec().tls == "auto"
    with pytest.raises(ValidationError, match="Input should be 'auto', 'on' or 'off'"):
        ClusterSpec.model_validate({"tls": "yes"})
