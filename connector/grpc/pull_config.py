"""A KVPuller's configuration, and how gRPC status codes map to pull failures.

The retry policy itself is `connector.pull_policy` (the one every transport
and node shares); `PullerConfig.fault_policy()` gives the `KVFaultPolicy`
that a puller's `pull()` runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from connector.pull_policy import KVFaultPolicy
from connector.transport import PullFailure
from engine.setting import check_declared

from .wire import MAX_MESSAGE_BYTES, validate_chunk_bytes

# Status codes that retrying cannot fix: the producer understood and refused.
FINAL_CODES = {
    grpc.StatusCode.NOT_FOUND: PullFailure.UNKNOWN_REQUEST,
    grpc.StatusCode.INVALID_ARGUMENT: PullFailure.REJECTED,
    grpc.StatusCode.FAILED_PRECONDITION: PullFailure.REJECTED,
    grpc.StatusCode.OUT_OF_RANGE: PullFailure.REJECTED,
    grpc.StatusCode.UNIMPLEMENTED: PullFailure.REJECTED,
    grpc.StatusCode.PERMISSION_DENIED: PullFailure.REJECTED,
    grpc.StatusCode.UNAUTHENTICATED: PullFailure.REJECTED,
}

RETRYABLE_CODES = {
    grpc.StatusCode.UNAVAILABLE: PullFailure.PRODUCER_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: PullFailure.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED: PullFailure.DEADLINE_EXCEEDED,
}  # every other code (INTERNAL, UNKNOWN, RESOURCE_EXHAUSTED, ...) → PRODUCER_ERROR


@dataclass(frozen=True)
class PullerConfig:
    """Retry and sizing settings of a KVPuller. Times are wall-clock seconds.

    The retry fields become a `KVFaultPolicy` (`fault_policy()`), which
    `KVPuller.pull` runs through `PullSession` / `DoneSession`.
    """

    attempt_timeout_s: float = 5.0  # one PullBlocks (or ReportDone) call
    deadline_s: float = 30.0  # the whole pull, retries included (and, apart, its done reports)
    max_concurrent_pulls: int = 8
    max_chunk_bytes: int = 0  # 0 = the producer's default
    backoff_initial_s: float = 0.02  # pause before a retry, doubling ...
    backoff_max_s: float = 0.5  # ... up to this
    report_done: bool = True
    consumer_id: str = ""
    max_message_bytes: int = MAX_MESSAGE_BYTES

    def __post_init__(self) -> None:
        # The times and the concurrency cap are the shared policy's settings: its declaration bounds them.
        for name in ("attempt_timeout_s", "deadline_s", "backoff_initial_s", "backoff_max_s", "max_concurrent_pulls"):
            check_declared(KVFaultPolicy, name, getattr(self, name), "PullerConfig")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                f"PullerConfig.backoff_max_s={self.backoff_max_s!r} is invalid; "
                f"allowed: >= backoff_initial_s ({self.backoff_initial_s})"
            )
        if self.max_chunk_bytes != 0:
            try:
                validate_chunk_bytes(self.max_chunk_bytes)
            except ValueError as err:
                raise ValueError(f"PullerConfig.{err}") from None
        m = self.max_message_bytes
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"PullerConfig.max_message_bytes must be an int >= 1, got {m!r}")

    def fault_policy(self) -> KVFaultPolicy:
        """The shared retry policy with this config's times (hold_timeout_s,
        a producer-side setting, is left at its default)."""
        return KVFaultPolicy(
            attempt_timeout_s=self.attempt_timeout_s,
            deadline_s=self.deadline_s,
            backoff_initial_s=self.backoff_initial_s,
            backoff_max_s=self.backoff_max_s,
            max_concurrent_pulls=self.max_concurrent_pulls,
        )
