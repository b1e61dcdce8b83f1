"""A Ray run's demands the cluster cannot meet are bad input, found before
the first run (bench/ray_checks.py): a group placed on a resource no Ray
node advertises; attaching with Ray's auth disabled; half the TLS files."""

from __future__ import annotations

import pytest
import yaml

from bench.errors import InputError
from bench.runner import run_scenario
from bench.scenario import load_scenario
from cluster.ray.auth import ray_auth_problem, require_ray_auth

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

SCENARIO = {
    "name": "placed",
    "runtime": "ray",
    "cluster": {"placement": {"decode": {"resources": {"host_nowhere": 1}}}, "time_scale": 0.1},
    "workload": {"num_requests": 2, "prompt_len": 32, "output_len": 4, "arrival": {"kind": "all_at_once"}},
    "variants": [{"name": "only", "set": {}}],
    "report": {"plots": False},
}


def test_a_group_placed_where_no_node_can_host_it_is_refused_before_running(tmp_path, ray_cluster):
    path = tmp_path / "placed.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    with pytest.raises(InputError) as info:
        run_scenario(load_scenario(path), out_dir=tmp_path / "out", ray_handle=ray_cluster)
    assert str(info.value).startswith(
        "variant only: cluster.placement.decode.resources: host_nowhere not advertised by any Ray node of the cluster"
    )
    assert "allowed: resources the cluster has" in str(info.value)
    assert not list(tmp_path.rglob("*.json"))  # nothing ran


def test_attaching_with_ray_auth_disabled_is_refused(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert ray_auth_problem().startswith("RAY_AUTH_MODE=disabled while attaching to a Ray cluster")
    with pytest.raises(ValueError, match="allowed: RAY_AUTH_MODE=token with the cluster's token"):
        require_ray_auth()
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert ray_auth_problem() is None
