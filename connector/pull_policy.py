"""The one fault policy of the KV handoff, pure and clock-free: how a pull is
retried, when it gives up, how the done report is retried, and how long a
producer holds blocks nobody reports on. Both runtimes run it — the decode
and prefill roles call it with their clock's `now` — so a KV outage gives
the same attempts, retries and failures in-process and on Ray.

A pull (`PullSession`):
- attempt k asks for the blocks still missing, with a timeout of
  min(attempt_timeout_s, time left to the deadline);
- a final failure (the producer does not hold the request, refused it, or a
  block's content was wrong) ends the pull at once;
- any other failure is retried after a backoff that starts at
  `backoff_initial_s` and doubles up to `backoff_max_s` (reset when an
  attempt made progress), unless the deadline has passed: then it fails.

A done report (`DoneSession`): after a successful pull, retried the same way
until acknowledged, refused, or `deadline_s` after it was first sent (at
least one attempt); after a failed pull, one best-effort attempt.

The producer frees a request's blocks when the consumer reports, or
`hold_timeout_s` after it began to hold them (vLLM's NIXL connector aborts
such requests too, after VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv_connector.pd_connector import RecvSpec
from engine.setting import MAX_RUN_S, setting

from .transport import DoneReport, DoneReportResult, PullAttempt, PullAttemptResult, PullFailure

# An attempt shorter than this is not made: the deadline counts as passed.
# Timers on the wall clock can fire a hair early or late; without this slack
# a retry due at the deadline could sneak in a last, microsecond-long attempt.
MIN_ATTEMPT_S = 0.001


@dataclass(frozen=True)
class KVFaultPolicy:
    """Times are run seconds: virtual in-process, wall (unscaled) on Ray.
    Declared here (engine/setting.py), validated by the scenario schema
    (`ClusterSpec`'s `kv_pull_*` keys) or, for the gRPC puller's own config,
    by `check_declared`."""

    attempt_timeout_s: float = setting(
        2.0,
        doc="One pull attempt's timeout. The KV fault policy (connector/pull_policy.py) is in run seconds: "
        "virtual in-process, wall (not scaled by time_scale) on Ray.",
        gt=0,
        le=MAX_RUN_S,
    )
    deadline_s: float = setting(
        10.0, doc="A whole pull, retries included (and, apart, its done reports).", gt=0, le=MAX_RUN_S
    )
    backoff_initial_s: float = setting(0.02, doc="The pause before a retry, doubling ...", gt=0, le=MAX_RUN_S)
    backoff_max_s: float = setting(0.5, doc="... up to this.", gt=0, le=MAX_RUN_S)
    # ClusterSpec.kv_hold_timeout_s (null: max(120, 6 x deadline)) gives the value.
    hold_timeout_s: float = 120.0
    max_concurrent_pulls: int = setting(
        64, doc="Pulls beyond this many wait for one to end (per consumer node).", ge=1, le=100_000
    )


@dataclass(frozen=True)
class Retry:
    at: float


@dataclass(frozen=True)
class Landed:
    pass


@dataclass(frozen=True)
class Failed:
    failure: PullFailure
    reason: str


PullDecision = Retry | Landed | Failed


@dataclass
class PullSession:
    """One load's progress across attempts."""

    spec: RecvSpec
    policy: KVFaultPolicy
    started: float
    consumer_id: str = ""
    ticket: str = ""
    attempts: int = 0
    checksum_failures: int = 0
    num_bytes: int = 0
    missing: list[int] = field(default_factory=list)
    _backoff: float = 0.0
    _last_failure: PullFailure = PullFailure.DEADLINE_EXCEEDED
    _last_reason: str = "no attempt fitted in the deadline"

    def __post_init__(self) -> None:
        if len(self.spec.remote_block_ids) != len(self.spec.local_block_ids):
            raise ValueError(
                f"{self.spec.request_id}: {len(self.spec.remote_block_ids)} remote blocks for "
                f"{len(self.spec.local_block_ids)} local blocks"
            )
        self.missing = list(range(len(self.spec.remote_block_ids)))
        self._backoff = self.policy.backoff_initial_s

    @property
    def deadline(self) -> float:
        return self.started + self.policy.deadline_s

    def next_attempt(self, now: float) -> PullAttempt | Failed:
        """The next attempt to make now, or the failure if the deadline has passed."""
        remaining = self.deadline - now
        if remaining < MIN_ATTEMPT_S:
            return Failed(self._last_failure, self._last_reason)
        self.attempts += 1
        spec = self.spec
        first = spec.first_block_index
        missing = self.missing
        if len(missing) == len(spec.remote_block_ids):  # every block (a first attempt): no gather
            remote, local = tuple(spec.remote_block_ids), tuple(spec.local_block_ids)
            indices = tuple(range(first, first + len(missing)))
        else:
            remote = tuple(spec.remote_block_ids[i] for i in missing)
            local = tuple(spec.local_block_ids[i] for i in missing)
            indices = tuple(first + i for i in missing)
        return PullAttempt(
            request_id=spec.request_id,
            remote_request_id=spec.remote_request_id,
            remote_address=spec.remote_address,
            remote_block_ids=remote,
            local_block_ids=local,
            # Prompt positions: a local prefix-cache hit covers the blocks before `first`.
            block_indices=indices,
            num_tokens=spec.num_tokens,
            number=self.attempts,
            timeout_s=min(self.policy.attempt_timeout_s, remaining),
            consumer_id=self.consumer_id,
            ticket=self.ticket,
        )

    def record(self, result: PullAttemptResult, now: float) -> PullDecision:
        """What to do after an attempt ended."""
        self.checksum_failures += result.checksum_failures
        self.num_bytes += result.num_bytes
        first = self.spec.first_block_index
        landed = {i - first for i in result.landed}
        if landed.issuperset(self.missing):  # the usual end: everything missing landed
            self.missing = []
            return Landed()
        progressed = bool(landed & set(self.missing))
        self.missing = [i for i in self.missing if i not in landed]
        failure = result.failure or PullFailure.PROTOCOL_ERROR
        reason = result.reason or "the attempt ended with blocks missing"
        if result.final:
            return Failed(failure, reason)
        self._last_failure, self._last_reason = failure, reason
        if progressed:
            self._backoff = self.policy.backoff_initial_s  # progress: retry promptly
        pause = self._backoff
        self._backoff = min(self._backoff * 2, self.policy.backoff_max_s)
        if now >= self.deadline - MIN_ATTEMPT_S:
            return Failed(failure, reason)
        return Retry(min(now + pause, self.deadline))


@dataclass
class DoneSession:
    """Telling the producer that the consumer is done with a request's blocks."""

    remote_request_id: str
    remote_address: str
    success: bool
    policy: KVFaultPolicy
    started: float
    consumer_id: str = ""
    reason: str = ""
    ticket: str = ""
    attempts: int = 0
    _backoff: float = 0.0

    def __post_init__(self) -> None:
        self._backoff = self.policy.backoff_initial_s

    @property
    def deadline(self) -> float:
        return self.started + self.policy.deadline_s

    def next_report(self, now: float) -> DoneReport:
        remaining = self.deadline - now
        timeout = self.policy.attempt_timeout_s if remaining <= 0 else min(self.policy.attempt_timeout_s, remaining)
        self.attempts += 1
        return DoneReport(
            remote_request_id=self.remote_request_id,
            remote_address=self.remote_address,
            success=self.success,
            number=self.attempts,
            timeout_s=timeout,
            consumer_id=self.consumer_id,
            reason=self.reason,
            ticket=self.ticket,
        )

    def record(self, result: DoneReportResult, now: float) -> Retry | None:
        """When to report again, or None: delivered, refused or given up."""
        if result.delivered or result.final or not self.success or now >= self.deadline - MIN_ATTEMPT_S:
            return None
        pause = self._backoff
        self._backoff = min(self._backoff * 2, self.policy.backoff_max_s)
        return Retry(min(now + pause, self.deadline))
