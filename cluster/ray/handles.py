"""Ray actor handles, typed at this one boundary.

Ray's typing of actors is weak: `@ray.remote` leaves mypy seeing the plain
class (no `.options`, no `.remote`), and a handle's methods are
`ActorMethod`s whose `.remote(...)` returns an `ObjectRef` of nothing in
particular. What a call returns is what the actor's method returned, pickled
across processes. So a handle is `ActorRef` (`Any`): the wire boundary of the
Ray runtime, like a msgpack frame. The records that cross it are typed here
(`ActorInfo`) or next to the actor that sends them (`ProxyStats`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

# A Ray actor handle (`ray.actor.ActorHandle`): `handle.method.remote(...)`.
ActorRef = Any


class ActorInfo(TypedDict, total=False):
    """What an actor's `start` / `ready` answers: where it runs."""

    name: str
    address: str  # a prefill node's KV server ("host:port")
    ray_node_id: str
    pid: int
    cpu_s: float
    stages: list[tuple[str, int]]  # a decode node's stage workers' addresses
    stage_ray_node_ids: list[str]


def spawn(actor_class: object, options: Mapping[str, object], *args: object) -> ActorRef:
    """`actor_class.options(**options).remote(*args)`: a new actor of a
    `@ray.remote` class (which mypy sees as the plain class)."""
    remote_class: Any = actor_class  # Ray's ActorClass, which the decorator made of it
    return remote_class.options(**options).remote(*args)
