"""Where the Ray runtime's actors go.

- Serving nodes: when the cluster advertises the custom resource
  `disagg_prefill` / `disagg_decode`, each node actor of that role takes one
  unit, so an operator decides how many prefill and decode nodes each
  machine hosts (`ray start --resources='{"disagg_decode": 2}'`). Without
  them, node actors are placed with the SPREAD strategy, one per machine
  while machines last. A local cluster launched by `RayClusterHandle`
  advertises both resources generously, so everything fits on it.
- Pipeline stages of a decode node: on the same Ray node as their node
  (hard node affinity: with soft affinity Ray spilled a stage to another
  node while the first was still starting), like the GPUs of one host.
- The proxy: pinned to the driver's machine, so the times it stamps and the
  driver's clock agree.

The scenario's `cluster.placement` (cluster/placement_spec.py) overrides the
first point: `spread` (SPREAD, whatever the cluster advertises), `pack` (all
on the driver's Ray node), or a group's own custom resources (each node
actor of the group takes them, so only Ray nodes advertising them host it).

Every actor asks for `num_cpus=0`: they are I/O bound (sleeps and RPCs), and
a 2-CPU machine would otherwise place only two of them.
"""

from __future__ import annotations

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cluster.placement_spec import PlacementSpec
from cluster.ray.env import ray

ROLE_RESOURCES = {"prefill": "disagg_prefill", "decode": "disagg_decode"}
# What a launched local cluster advertises: room for any test topology.
LOCAL_ROLE_UNITS = 64


def node_actor_options(
    role: str,
    cluster_resources: dict[str, float],
    placement: PlacementSpec | None = None,
    driver_node_id: str | None = None,
) -> dict:
    try:
        resource = ROLE_RESOURCES[role]
    except KeyError:
        raise ValueError(f"role {role!r} is unknown; allowed: {sorted(ROLE_RESOURCES)}") from None
    placement = placement or PlacementSpec()
    own = getattr(placement, role).resources
    if own:
        problem = placement_problem(placement, cluster_resources)
        if problem:
            raise ValueError(problem)
        return {"num_cpus": 0, "resources": dict(own)}
    if placement.strategy == "spread":
        return {"num_cpus": 0, "scheduling_strategy": "SPREAD"}
    if placement.strategy == "pack":
        if driver_node_id is None:
            raise ValueError("placement strategy 'pack' needs the driver's Ray node id")
        return pinned_options(driver_node_id)
    if cluster_resources.get(resource, 0) >= 1:
        return {"num_cpus": 0, "resources": {resource: 1}}
    return {"num_cpus": 0, "scheduling_strategy": "SPREAD"}


def placement_problem(placement: PlacementSpec, cluster_resources: dict[str, float]) -> str | None:
    """Why the cluster cannot host a group as `placement` asks (a custom
    resource no Ray node advertises, or not enough of it), or None."""
    for role in ROLE_RESOURCES:
        own = getattr(placement, role).resources
        missing = sorted(name for name, amount in own.items() if cluster_resources.get(name, 0) < amount)
        if missing:
            return (
                f"cluster.placement.{role}.resources: {', '.join(missing)} not advertised by any Ray node of the "
                f"cluster (or not enough); allowed: resources the cluster has "
                f"(ray start --resources='{{\"{missing[0]}\": 4}}' on the machines that should host {role} nodes)"
            )
    return None


def colocated_options(ray_node_id: str) -> dict:
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(ray_node_id, soft=False)}


def pinned_options(ray_node_id: str) -> dict:
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(ray_node_id, soft=False)}


def current_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def describe_placement(cluster_resources: dict[str, float], placement: PlacementSpec | None = None) -> str:
    placement = placement or PlacementSpec()
    own = [f"{r}: {getattr(placement, r).resources}" for r in ROLE_RESOURCES if getattr(placement, r).resources]
    if own:
        return f"the scenario's resources ({'; '.join(own)}), else {placement.strategy}"
    if placement.strategy == "spread":
        return "SPREAD (cluster.placement.strategy)"
    if placement.strategy == "pack":
        return "pack: every node on the driver's Ray node (cluster.placement.strategy)"
    roles = [r for r, res in ROLE_RESOURCES.items() if cluster_resources.get(res, 0) >= 1]
    return f"custom resources for {', '.join(roles)}" if roles else "SPREAD (no disagg_* resources advertised)"
