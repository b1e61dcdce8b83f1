"""Where a Ray run's node actors go, and whether its KV handoff uses TLS:
the scenario's `cluster.placement` and `cluster.tls` (Ray runtime only;
in-process runs have one process and ignore both).

    cluster:
      placement:
        strategy: spread          # auto (default) | spread | pack
        prefill: {resources: {host_a: 1}}   # each prefill node actor takes one host_a
        decode: {resources: {host_b: 1}}
      tls: auto                   # auto (default) | on | off

- `strategy`: `spread` puts node actors on as many Ray nodes as there are
  (Ray's SPREAD); `pack` puts them all on the driver's Ray node; `auto`
  uses the `disagg_prefill` / `disagg_decode` resources when the cluster
  advertises them, else spreads (cluster/ray/placement.py).
- A group's `resources` win over the strategy: each node actor of that
  group takes these custom resources, so it goes only to a Ray node that
  advertises them (`ray start --resources='{"host_a": 4}'`): how a group is
  pinned to machines by name or kind.
- `tls`: `auto` turns TLS on for the KV handoff and the framed-TCP links
  (proxy channel, stage links) when the run is attached to a cluster
  (`--address`), off on the local default (everything on 127.0.0.1);
  certificates are generated per run (cluster/wall/tls.py).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from .settings_base import StrictModel

RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")
# Ray's own resources: a group asks for custom ones only (CPU and GPU are the runtime's business).
RESERVED = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


class GroupPlacement(StrictModel):
    # Custom Ray resources each node actor of the group takes, e.g. {host_a: 1}.
    resources: dict[str, float] = Field(default_factory=dict)

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name in RESERVED or not RESOURCE_NAME.match(name):
                raise ValueError(
                    f"resource {name!r} is invalid; allowed: a custom resource name (letters, digits, _ . : -; "
                    f"not {', '.join(sorted(RESERVED))})"
                )
            if not 0 < amount <= 10_000:
                raise ValueError(f"resource {name}={amount} is invalid; allowed: an amount in (0, 10000]")
        return v


class PlacementSpec(StrictModel):
    strategy: Literal["auto", "spread", "pack"] = "auto"
    prefill: GroupPlacement = Field(default_factory=GroupPlacement)
    decode: GroupPlacement = Field(default_factory=GroupPlacement)


TlsMode = Literal["auto", "on", "off"]
