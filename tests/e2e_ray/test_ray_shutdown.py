"""Clean shutdown: after the cluster handle closes — also when the `with`
block is left by an exception or by Ctrl-C in the middle of a run — none of
the processes the cluster ran (GCS, raylet, workers, our node and stage
actors with their gRPC and frame servers) is left, and its temp dir is gone.

Each case runs in a child process, because it launches and shuts down a
cluster of its own next to the session's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.ray import processes as ray_processes

pytestmark = [pytest.mark.ray, pytest.mark.timeout(150)]

ROOT = Path(__file__).resolve().parents[2]


def _child(mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e_ray.shutdown_child", mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _assert_all_gone(pids: set[int], temp_dir: str) -> None:
    left = ray_processes.wait_gone(pids, timeout_s=10.0)
    assert left == set(), {p: ray_processes.command_line(p) for p in left}
    assert not os.path.exists(temp_dir)


def test_nothing_is_left_after_an_exception_inside_the_with_block():
    child = _child("exception")
    try:
        out, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 1  # the RuntimeError propagated out of the `with`
    state = json.loads(out.strip().splitlines()[-1])
    assert state["state"] == "ran" and len(state["pids"]) >= 5  # GCS, raylet, ..., 3 actors
    _assert_all_gone(set(state["pids"]), state["temp_dir"])


def test_nothing_is_left_after_ctrl_c_during_a_run():
    child = _child("sigint")
    state = None
    try:
        deadline = time.monotonic() + 90
        for line in child.stdout:
            state = json.loads(line)
            if state["state"] == "running" or time.monotonic() > deadline:
                break
        assert state is not None and state["state"] == "running"
        os.kill(child.pid, signal.SIGINT)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode != 0
    assert len(state["pids"]) >= 5
    _assert_all_gone(set(state["pids"]), state["temp_dir"])
