"""Faults a Ray run is given (`run_ray(faults=...)`), checked before it
starts: kills, and restarts of nodes killed before (docs/ray.md)."""

from __future__ import annotations

from ..spec import ClusterSpec

# A fault the caller scheduled, as a scenario spells it: {"kill": <node name>, "at": <run seconds>},
# or {"restart": <node name>, "at": <run seconds>} (a fresh process for a node killed before).
FaultSpec = dict[str, object]
FAULT_KINDS = ("kill", "restart")


def split_faults(
    faults: list[FaultSpec] | None, spec: ClusterSpec
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(kills, restarts), each as (node, run seconds)."""
    names = [ns.name for _, ns, _ in spec.node_specs()]
    out: dict[str, list[tuple[str, float]]] = {kind: [] for kind in FAULT_KINDS}
    for i, fault in enumerate(faults or []):
        kinds = [k for k in FAULT_KINDS if isinstance(fault, dict) and set(fault) == {k, "at"}]
        if not kinds:
            raise ValueError(
                f"faults[{i}]={fault!r} is invalid; allowed: {{'kill' or 'restart': <node name>, 'at': <run seconds>}}"
            )
        kind = kinds[0]
        name, at = fault[kind], fault["at"]
        if name not in names:
            raise ValueError(f"faults[{i}]: node {name!r} is unknown; allowed: {', '.join(names)}")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or at < 0:
            raise ValueError(f"faults[{i}]: at={at!r} is invalid; allowed: run seconds >= 0")
        out[kind].append((name, float(at)))
    for name, at in out["restart"]:
        if not any(k == name and k_at < at for k, k_at in out["kill"]):
            raise ValueError(f"faults: restart of {name} at {at:g} s follows no kill of it; allowed: after its kill")
    return out["kill"], out["restart"]


def parse_faults(faults: list[FaultSpec] | None, spec: ClusterSpec) -> list[tuple[str, float]]:
    """The kills (`split_faults`)."""
    return split_faults(faults, spec)[0]


__all__ = ["FAULT_KINDS", "FaultSpec", "parse_faults", "split_faults"]
