"""Several Ray nodes on one machine, each a `ray start` of its own on a
loopback alias (127.0.0.2 the head, 127.0.0.3, 127.0.0.4, ... the others):
a multi-node cluster for tests and benchmarks that never leaves the host.

    with LocalRayNodes([NodeSpec(cpus=0), NodeSpec(cpus=1), NodeSpec(cpus=1)]) as nodes:
        subprocess.run(["disagg-sim", "run", "x.yaml", "--address", nodes.address, "--jobs", "2"], env=nodes.env())
        nodes.kill(2)                      # that node's raylet and workers, SIGKILL: a machine lost

Why aliases (docs/ray.md, "A two-node Ray cluster on one machine"): two Ray
nodes need two addresses, and a node only joins a cluster with
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1`, under which Ray would turn 127.0.0.1
into the eth0 address; any other 127.x.x.x address is kept as given.

Each node runs `ray start --block` as the leader of a session of its own,
so killing that session's processes ends exactly that node (its raylet,
object store and workers: Ray gives each worker a process group of its
own, but they stay in the session), as a lost machine would. Token authentication is
on, with this process's private token (`cluster/ray/auth.py`); a driver
started with `env()` carries it. Leaving the block ends every process of
the cluster, by PID, and checks none is left (`leftover_pids`).

This process never calls `ray.init`: a test session's own local cluster
(tests/conftest.py) may be running in it, and Ray allows one per process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import processes as ray_processes
from .auth import MODE_ENV, use_private_token_auth

HEAD_IP = "127.0.0.2"
START_TIMEOUT_S = 180.0  # `ray start` of one node; minutes on a loaded 2-core machine
OBJECT_STORE_BYTES = 80 << 20  # Ray's minimum is 78 MiB; runs return results of a few MB


@dataclass(frozen=True)
class NodeSpec:
    cpus: int = 1
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


def node_ip(index: int) -> str:
    """Node 0 (the head) at 127.0.0.2, node i at 127.0.0.(2+i)."""
    if not 0 <= index < 250:
        raise ValueError(f"node index {index} is invalid; allowed: 0..249")
    return f"127.0.0.{2 + index}"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalRayNodes:
    def __init__(self, nodes: list[NodeSpec], start_timeout_s: float = START_TIMEOUT_S) -> None:
        if not nodes:
            raise ValueError("nodes=[] is invalid; allowed: one NodeSpec per Ray node, the head first")
        self.specs = list(nodes)
        self.start_timeout_s = start_timeout_s
        self.temp_dir = ""
        self.address = ""
        self.leaders: list[subprocess.Popen] = []
        self.killed: set[int] = set()
        self.leftover_pids: set[int] = set()
        self._logs: list[Path] = []

    def env(self) -> dict[str, str]:
        """The environment for a driver (or `ray` CLI) of this cluster."""
        env = dict(os.environ)
        env.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0"})
        # A node joining, or a driver attaching, takes token mode only when told (a new head turns it on itself).
        env.setdefault(MODE_ENV, "token")
        return env

    def __enter__(self) -> LocalRayNodes:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        use_private_token_auth()  # sets RAY_AUTH_TOKEN_PATH here, so the nodes and drivers started from here share it
        self.temp_dir = tempfile.mkdtemp(prefix="dsr-mn-", dir="/tmp")
        port = _free_port(HEAD_IP)
        self.address = f"{HEAD_IP}:{port}"
        for index, spec in enumerate(self.specs):
            args = ["--port", str(port)] if index == 0 else ["--address", self.address]
            self._start_node(index, spec, args)

    def _start_node(self, index: int, spec: NodeSpec, where: list[str]) -> None:
        ray_cli = str(Path(sys.executable).with_name("ray"))
        cmd = [
            ray_cli,
            "start",
            "--block",
            *(["--head", "--include-dashboard", "false", "--temp-dir", self.temp_dir] if index == 0 else []),
            *where,
            "--node-ip-address",
            node_ip(index),
            "--num-cpus",
            str(spec.cpus),
            "--object-store-memory",
            str(OBJECT_STORE_BYTES),
            "--disable-usage-stats",
        ]
        if spec.resources:
            cmd += ["--resources", json.dumps(spec.resources)]
        if spec.labels:
            cmd += ["--labels", ",".join(f"{k}={v}" for k, v in spec.labels.items())]
        log = Path(self.temp_dir) / f"node{index}.log"
        self._logs.append(log)
        with open(log, "wb") as out:
            leader = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)
        self.leaders.append(leader)
        deadline = time.monotonic() + self.start_timeout_s
        while b"Ray runtime started" not in log.read_bytes():
            if leader.poll() is not None or time.monotonic() > deadline:
                tail = log.read_bytes()[-600:].decode(errors="replace")
                raise RuntimeError(f"ray start of node {index} ({node_ip(index)}) failed: {tail}")
            time.sleep(0.2)

    def running(self, index: int, task_name: str) -> bool:
        """True while a worker of node `index` runs a task or actor named
        `task_name` (Ray titles a busy worker `ray::<name>`)."""
        return any(
            ray_processes.command_line(pid).startswith(f"ray::{task_name}") for pid in _session(self.leaders[index].pid)
        )

    def kill(self, index: int) -> None:
        """End node `index` at once (SIGKILL to every process of its session):
        its raylet, object store and workers die as a lost machine's would."""
        if index == 0:
            raise ValueError("node 0 is the head; killing it ends the cluster. Allowed: 1..")
        for pid in _session(self.leaders[index].pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.killed.add(index)

    def close(self) -> None:
        """End every process of the cluster, by PID: SIGTERM, then SIGKILL
        after a few seconds (nothing of it is worth keeping)."""
        pids = {p for leader in self.leaders for p in _session(leader.pid)}
        if self.temp_dir:
            pids |= ray_processes.session_processes(self.temp_dir)
        self.leftover_pids = ray_processes.end_processes(pids, grace_s=3.0)
        for leader in self.leaders:
            if leader.poll() is None:
                leader.kill()
            leader.wait(timeout=5)
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.leaders = []


def _session(sid: int) -> set[int]:
    """The live processes of session `sid` (a node's `ray start` and all it started)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    out.add(int(entry))
            except OSError:
                continue
    return out
