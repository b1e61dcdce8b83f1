"""Small helpers for building runs. The session's one loopback Ray cluster,
`ray_cluster`, is in `tests/conftest.py` (shared with `tests/serve/`).

Every test here is marked `ray` and bounded by pytest-timeout; every run
inside a test is bounded by `run_ray(timeout_s=...)` as well, so a stuck run
fails its test instead of hanging the session.
"""

from __future__ import annotations

from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest


def make_spec(**overrides) -> ClusterSpec:
    """A small P/D topology; `overrides` replace top-level ClusterSpec fields."""
    base = {
        "prefill": {"count": 1, "engine": {"num_gpu_blocks": 2000}},
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 1000, "async_scheduling": True}},
        "time_scale": 0.1,
        "kv_pull_timeout_s": 0.5,
        "kv_pull_deadline_s": 3.0,
        # The transport and its faults are these tests' subject, with timeouts sized for a hand-off
        # that costs only its links; the connector's own terms are tests/unit/test_pd_timeline.py's.
        "kv_transfer": {"preset": "none"},
    }
    base.update(overrides)
    return ClusterSpec.model_validate(base)


def workload(
    n: int, prompt_len: int, output_len: int, gap_s: float = 0.0, start_s: float = 0.0, prefix: str = "r"
) -> list[WorkloadRequest]:
    return [WorkloadRequest(f"{prefix}{i:03d}", start_s + i * gap_s, prompt_len, output_len) for i in range(n)]
