"""`RayClusterHandle`: launch a local Ray cluster on loopback, or attach to
an existing one, and leave nothing behind.

    with RayClusterHandle() as handle:                 # local, 127.0.0.1
        run_ray(spec, workload, handle=handle)
    with RayClusterHandle(address="127.0.0.1:6379"):   # attach (`ray start`)
        ...

Local launch (docs/platform.md): no dashboard, a bounded object store
(256 MiB), a short temp dir (Unix socket paths must stay under 107 bytes),
the loopback environment of `cluster.ray.env`, and the custom resources
`disagg_prefill` / `disagg_decode` for placement (`cluster.ray.placement`).

Shutdown, also after an exception, Ctrl-C or SIGTERM inside the `with`: every
actor the handle tracked is killed, Ray is shut down, and for a launched
cluster every process Ray started (all descendants of this process seen while
it ran) must be gone; stragglers are ended by PID and listed in
`leftover_pids` (empty on a clean shutdown).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypedDict

from cluster.ray.env import ray

from . import processes as ray_processes
from .auth import use_private_token_auth
from .handles import ActorRef
from .placement import LOCAL_ROLE_UNITS, ROLE_RESOURCES, current_node_id

logger = logging.getLogger(__name__)

DEFAULT_OBJECT_STORE_BYTES = 256 << 20
DEFAULT_NAMESPACE = "disagg-sim"


class _InitArgs(TypedDict, total=False):
    """`ray.init`'s arguments a launched and an attached cluster share."""

    namespace: str
    log_to_driver: bool
    logging_level: int
    runtime_env: dict[str, Any]  # only if given
    _node_ip_address: str  # attached only, and only if given


class RayClusterHandle:
    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        object_store_memory: int = DEFAULT_OBJECT_STORE_BYTES,
        temp_dir: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        log_to_driver: bool = False,
        shutdown_timeout_s: float = 15.0,
        node_ip_address: str | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        """`runtime_env`: Ray's job-level runtime environment for every task
        and actor of this driver (a sweep on a cluster ships the project's
        code with it: bench/cluster_sweep.py). `node_ip_address` (attach only): the address of this machine's Ray
        node. Ray finds it itself, except for a cluster on loopback aliases
        (a head at 127.0.0.2, say, as in docs/ray.md): for an address on
        127.x.x.x other than 127.0.0.1 it defaults to that host."""
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(
                f"address={address!r} is invalid; allowed: 'host:port' of a running Ray cluster, or None to launch one"
            )
        if object_store_memory < 78 << 20:
            raise ValueError(
                f"object_store_memory={object_store_memory} is invalid; allowed: >= 78 MiB (Ray's minimum)"
            )
        self.address = address
        self.node_ip_address = node_ip_address if address is not None else None
        if address is not None and node_ip_address is None:
            host = address.rsplit(":", 1)[0]
            if host.startswith("127.") and host != "127.0.0.1":
                self.node_ip_address = host
        self.num_cpus = num_cpus
        self.runtime_env = runtime_env
        self.object_store_memory = object_store_memory
        self.namespace = namespace
        self.log_to_driver = log_to_driver
        self.shutdown_timeout_s = shutdown_timeout_s
        self._temp_dir_arg = temp_dir
        self.temp_dir: str | None = None
        self.launched = address is None
        self.started = False
        self.closed = False
        self.leftover_pids: set[int] = set()
        self.ray_pids: set[int] = set()
        self._actors: list[ActorRef] = []
        self._preexisting: set[int] = set()
        self._previous_sigterm: signal.Handlers | int | Callable[[int, FrameType | None], object] | None = None
        self._run_counter = 0

    # -- lifecycle ---------------------------------------------------------------
    def __enter__(self) -> RayClusterHandle:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> RayClusterHandle:
        if self.started:
            return self
        if ray.is_initialized():
            raise RuntimeError("Ray is already initialised in this process; use one RayClusterHandle at a time")
        common = _InitArgs(namespace=self.namespace, log_to_driver=self.log_to_driver, logging_level=logging.WARNING)
        if self.runtime_env is not None:
            common["runtime_env"] = self.runtime_env
        if self.launched:
            self._preexisting = ray_processes.descendants()
            self.temp_dir = self._temp_dir_arg or tempfile.mkdtemp(prefix="dsr-", dir="/tmp")
            use_private_token_auth()  # cluster/ray/auth.py says why
            ray.init(
                include_dashboard=False,
                object_store_memory=self.object_store_memory,
                _temp_dir=self.temp_dir,
                num_cpus=self.num_cpus if self.num_cpus is not None else os.cpu_count(),
                resources={res: LOCAL_ROLE_UNITS for res in ROLE_RESOURCES.values()},
                **common,
            )
        else:
            if self.node_ip_address is not None:
                common["_node_ip_address"] = self.node_ip_address
            ray.init(address=self.address, **common)
        self.started = True
        self._snapshot_ray_processes()
        self._install_sigterm()
        return self

    def close(self) -> None:
        if not self.started or self.closed:
            return
        self.closed = True
        try:
            for actor in self._actors:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # already dead or never placed
                    pass
            self._actors.clear()
            if self.launched:
                self._snapshot_ray_processes()
        finally:
            ray.shutdown()
            self._restore_sigterm()
            if self.launched:
                self._reap()

    # -- actors ------------------------------------------------------------------
    def track(self, actor: ActorRef) -> None:
        """Kill this actor when the handle closes (if nobody did before)."""
        self._actors.append(actor)

    def untrack(self, actor: ActorRef) -> None:
        self._actors = [a for a in self._actors if a is not actor]

    def next_run_name(self) -> str:
        self._run_counter += 1
        return f"run{os.getpid()}-{self._run_counter}"

    # -- facts ---------------------------------------------------------------------
    def cluster_resources(self) -> dict[str, float]:
        return dict(ray.cluster_resources())

    def nodes(self) -> list[dict[str, Any]]:
        """Ray's own description of each live node (`ray.nodes()`, as Ray returns it)."""
        return [n for n in ray.nodes() if n.get("Alive")]

    @property
    def driver_node_id(self) -> str:
        return current_node_id()

    def describe(self) -> str:
        where = f"local on 127.0.0.1 (temp dir {self.temp_dir})" if self.launched else f"attached to {self.address}"
        return f"Ray {ray.__version__}, {where}, {len(self.nodes())} node(s)"

    # -- processes -------------------------------------------------------------------
    def ray_processes(self) -> set[int]:
        """PIDs of the processes this handle's launched cluster runs now (and
        ran before): what must be gone after `close()`."""
        self._snapshot_ray_processes()
        return set(self.ray_pids)

    def _snapshot_ray_processes(self) -> None:
        # Only what appeared since the launch and is Ray's: never a child this
        # process had before (a test's own subprocess, say).
        if self.launched:
            for pid in ray_processes.descendants() - self._preexisting:
                if "ray" in ray_processes.command_line(pid).lower():
                    self.ray_pids.add(pid)

    def _reap(self) -> None:
        left = ray_processes.wait_gone(self.ray_pids, self.shutdown_timeout_s)
        if left:
            logger.warning(
                "Ray left %d process(es) after shutdown; ending them: %s",
                len(left),
                {p: ray_processes.command_line(p)[:80] for p in left},
            )
            left = ray_processes.end_processes(left)
        ray_processes.reap_children()
        self.leftover_pids = left
        if self._temp_dir_arg is None and self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    # -- signals ---------------------------------------------------------------------
    def _install_sigterm(self) -> None:
        """SIGTERM unwinds like Ctrl-C, so the `with` block's exit shuts Ray down."""
        if threading.current_thread() is not threading.main_thread():
            return

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt("SIGTERM")

        self._previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
