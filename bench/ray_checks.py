"""What a Ray run needs of the cluster it runs on, checked before the
first run so a setting the cluster cannot honour is bad input (exit 2, one
line) rather than a run that fails: the groups' placement resources, Ray's
token authentication when attached, and the user's TLS files if given."""

from __future__ import annotations

from typing import Any

from .errors import InputError
from .scenario import Scenario


def check_ray_run(scenario: Scenario, variants: list[str], handle: Any) -> None:
    from cluster.ray.auth import ray_auth_problem
    from cluster.ray.placement import placement_problem
    from cluster.wall.tls import kv_tls_for_run

    attached = not handle.launched
    if attached and (problem := ray_auth_problem()):
        raise InputError(problem)
    resources = handle.cluster_resources()
    for variant in variants:
        spec = scenario.cluster(variant)
        if problem := placement_problem(spec.placement, resources):
            raise InputError(f"variant {variant}: {problem}")
        try:
            kv_tls_for_run(spec.tls, attached)
        except ValueError as err:
            raise InputError(f"variant {variant}: {err}") from None
