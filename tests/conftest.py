"""Fixtures every test directory shares.

`ray_cluster`: one loopback Ray cluster for the whole session (starting one
costs seconds; docs/platform.md, "Start-up and actor costs"). It lives here,
not in `tests/e2e_ray/`, because Ray allows one cluster per process and
both `tests/e2e_ray/` and `tests/serve/` (the OpenAI front door on Ray) use it.

A background job of a non-interactive shell (`make test &`, `nohup ... &`)
starts with SIGINT ignored, and every process it starts inherits that: the
tests that stop a child with Ctrl-C (`test_ray_shutdown.py`,
`test_serve_cli.py`) then wait for a child that cannot hear it. So the
session takes SIGINT back first (a handled signal reverts to the default in
an exec'd child, and Python then raises KeyboardInterrupt as usual).
"""

from __future__ import annotations

import signal

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under tests/e2e_ray/, and any test on the session's Ray
    cluster, is a `ray` test: `make test` runs those in one process after the
    others (Ray allows one cluster per process; the rest run two at a time)."""
    for item in items:
        if "e2e_ray" in item.path.parts or "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def ray_cluster():
    from cluster.ray.cluster import RayClusterHandle

    handle = RayClusterHandle()
    with handle:
        yield handle
    # The session's own shutdown must leave nothing behind either.
    assert handle.leftover_pids == set(), f"Ray processes left behind: {handle.leftover_pids}"
