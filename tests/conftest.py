"""Fixtures every test directory shares.

`ray_cluster`: one loopback Ray cluster for the whole session (starting one
costs seconds; docs/platform.md, "Start-up and actor costs"). It lives here,
not in `tests/e2e_ray/`, because Ray allows one cluster per process and
both `tests/e2e_ray/` and `tests/serve/` (the OpenAI front door on Ray) use it.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    from cluster.ray.cluster import RayClusterHandle

    handle = RayClusterHandle()
    with handle:
        yield handle
    # The session's own shutdown must leave nothing behind either.
    assert handle.leftover_pids == set(), f"Ray processes left behind: {handle.leftover_pids}"
