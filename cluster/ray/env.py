"""Import Ray through this module: it sets the environment Ray must see
before it is imported (docs/platform.md, "Loopback binding"), then imports it.

- RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes a local Ray bind and advertise
  127.0.0.1 instead of eth0 (it ignores `_node_ip_address`), so the local
  default keeps every byte on loopback.
- RAY_USAGE_STATS_ENABLED=0: no usage reporting.

Ray's token authentication (on by default in 2.60) is left as Ray ships it
here. Only `use_local_loopback_auth()` turns it off, and only
`RayClusterHandle` calls it, when it launches the local cluster itself:
that cluster binds 127.0.0.1 only (the setting above), so only processes on
this machine can reach it, and they share its files anyway. Attached to a
cluster (`--address`), the driver keeps Ray's default: token auth on, the
token from RAY_AUTH_TOKEN / ~/.ray/auth_token as the cluster was started
(docs/security.md).

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
LOCAL_LOOPBACK_AUTH = {"RAY_AUTH_MODE": "disabled"}

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


def use_local_loopback_auth() -> None:
    """Before launching the loopback-only local cluster: no token auth
    (Ray reads the mode when it starts; a value the user set wins)."""
    for key, value in LOCAL_LOOPBACK_AUTH.items():
        os.environ.setdefault(key, value)


__all__ = ["ray", "RAY_ENV", "use_local_loopback_auth"]
