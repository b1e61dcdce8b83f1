"""Import Ray through this module: it sets the environment Ray must see
before it is imported (docs/platform.md, "Loopback binding"), then imports it.

- RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes a local Ray bind and advertise
  127.0.0.1 instead of eth0 (it ignores `_node_ip_address`), so the local
  default keeps every byte on loopback.
- RAY_USAGE_STATS_ENABLED=0: no usage reporting.

Ray's token authentication is `cluster/ray/auth.py`'s: on, with a private
token, for every cluster `RayClusterHandle` launches.

Values already set by the user win (`setdefault`).
"""

from __future__ import annotations

import os
import sys
import warnings

RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}

if "ray" in sys.modules and any(os.environ.get(k) is None for k in RAY_ENV):
    warnings.warn(
        "ray was imported before cluster.ray.env: a local cluster may bind eth0 instead of 127.0.0.1; "
        "import cluster.ray.env (or set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) before ray",
        RuntimeWarning,
        stacklevel=2,
    )
for _key, _value in RAY_ENV.items():
    os.environ.setdefault(_key, _value)

import ray  # noqa: E402  (must come after the environment above)

__all__ = ["ray", "RAY_ENV"]
