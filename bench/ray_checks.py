"""What a Ray run needs of the cluster it runs on, checked before the
first run so a setting the cluster cannot honour is bad input (exit 2, one
line) rather than a run that fails: an `--address` where something answers
(Ray's own attach retries for minutes), the groups' placement resources,
Ray's token authentication when attached, and the user's TLS files if
given."""

from __future__ import annotations

import socket
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


def check_address(address: str | None, timeout_s: float = 5.0) -> None:
    """`--address HOST:PORT`: something must accept a connection there
    (other forms, such as `auto` or `ray://...`, are Ray's to check)."""
    if address is None:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in address:
        return
    if not 0 < int(port) < 65536:
        raise InputError(f"--address {address}: port {port} is out of range; allowed: host:port of a Ray head")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__)
        raise InputError(
            f"--address {address}: no Ray cluster answers there ({why}); allowed: host:port of a running Ray "
            "cluster's head (ray start --head --port PORT), or no --address for a local cluster"
        ) from None
