"""Run as a child process by test_ray_shutdown.py: launch a local cluster,
report the PIDs of its processes (Ray's and our actors', which host the
gRPC servers), then leave the `with` block by an exception or by Ctrl-C.

    python -m tests.e2e_ray.shutdown_child exception|sigint
"""

from __future__ import annotations

import json
import sys

from cluster.ray.cluster import RayClusterHandle
from cluster.ray.runtime import run_ray
from engine.records import WorkloadRequest

from .conftest import make_spec


def report(handle: RayClusterHandle, state: str) -> None:
    print(json.dumps({"state": state, "pids": sorted(handle.ray_processes()), "temp_dir": handle.temp_dir}), flush=True)


def main(mode: str) -> None:
    with RayClusterHandle() as handle:
        if mode == "exception":
            run_ray(make_spec(), [WorkloadRequest("r0", 0.0, 32, 4)], handle=handle, timeout_s=60)
            report(handle, "ran")
            raise RuntimeError("an error inside the with block")
        # sigint: a long run; the parent interrupts it once the first (short)
        # request is back, i.e. while every actor is up and serving.
        long = [WorkloadRequest("r0", 0.0, 32, 1)] + [WorkloadRequest(f"r{i}", 0.0, 32, 5000) for i in range(1, 8)]
        spec = make_spec(time_scale=1.0, decode={"count": 1, "engine": {"num_gpu_blocks": 1000, "max_model_len": 8192}})
        run_ray(spec, long, handle=handle, timeout_s=120, progress=lambda p: report(handle, "running"))


if __name__ == "__main__":
    main(sys.argv[1])
