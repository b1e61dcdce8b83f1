"""`Request` and `RequestStatus`, shaped like vLLM v1's `vllm/v1/request.py`.

A request carries token ids only as far as the scheduler needs them: the prompt
is represented by its length (plus optional ids), outputs are real ids produced
by the sampler, because stop tokens are decided on them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

# An output id not drawn yet (see `Request.append_unsampled`); never a real id.
UNSAMPLED = -1


class RequestStatus(enum.IntEnum):
    """Ordered like vLLM: every value above PREEMPTED is a finished state."""

    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> str | None:
        return _FINISHED_REASONS.get(status)


_FINISHED_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass
class SamplingParams:
    """The subset of vLLM's SamplingParams the scheduler reads."""

    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")


class Request:
    """One generation request as the v1 scheduler sees it."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float = 0.0,
        priority: int = 0,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> None:
        if len(prompt_token_ids) == 0:
            raise ValueError(f"request {request_id!r}: the prompt must hold at least one token")
        self.request_id = request_id
        # Kept by reference (any sequence, e.g. a range): simulated prompts are
        # never read token by token, and 10k long prompts should cost nothing.
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        self.max_tokens = sampling_params.max_tokens
        # vLLM: ignore_eos leaves eos_token_id unset for the stop check.
        self.eos_token_id = None if sampling_params.ignore_eos else eos_token_id
        self.arrival_time = arrival_time
        self.priority = priority
        self.kv_transfer_params = kv_transfer_params

        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self._output_token_ids: list[int] = []
        self.num_tokens = self.num_prompt_tokens
        self.spec_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_preemptions = 0

        # Overlap bookkeeping (async scheduling / batch queue).
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.drop_stale_output = False
        self.is_prefill_chunk = False
        # The deferred-free fence: the newest non-empty step that included us.
        self.last_sched_seq = 0
        # Set at the end of an async KV load to remember it finished.
        self.num_external_computed_tokens = 0
        # Prefix caching: chained hashes of the full blocks of its tokens
        # (`engine/block_hash.py`), and the prompt tokens that hit the cache.
        self.block_hashes: list[int] = []
        self.num_cached_tokens = -1
        # Steady-decode fast-forward (`engine/steady_decode.py`): outputs it
        # advanced over hold UNSAMPLED until someone reads the ids, which are
        # then drawn from this sampler function (ids depend only on position).
        self._token_source: Callable[[str, int], int] | None = None
        # In a steady-decode cohort (`engine/steady_cohort.py`), in absolute
        # steps: the step that finishes it, its first step that takes a new
        # block, its computed tokens minus the current step, and the step its
        # counters were last written for (the cohort writes them lazily).
        self.steady_finish = 0
        self.steady_due = 0
        self.steady_offset = 0
        self.steady_written = 0
        # The step its shadow-KV decodes were issued up to (engine/steady_shadow.py).
        self.steady_shadow_at = 0

    # -- token views -------------------------------------------------------
    @property
    def output_token_ids(self) -> list[int]:
        if self._token_source is not None:
            self._fill_unsampled()
        return self._output_token_ids

    def append_unsampled(self, n: int, token_at: Callable[[str, int], int]) -> None:
        """`n` outputs whose ids nobody has needed yet (no stop check can read
        them: the request can only stop at its length cap)."""
        self._output_token_ids.extend(repeat(UNSAMPLED, n))
        self.num_tokens += n
        self._token_source = token_at

    def _fill_unsampled(self) -> None:
        token_at, self._token_source = self._token_source, None
        assert token_at is not None
        ids, base, rid = self._output_token_ids, self.num_prompt_tokens, self.request_id
        for i, tok in enumerate(ids):
            if tok == UNSAMPLED:
                ids[i] = token_at(rid, base + i)

    @property
    def all_token_ids(self) -> list[int]:
        return list(self.prompt_token_ids) + self._output_token_ids

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self.num_tokens += len(token_ids)

    def trim_output_tokens(self, n: int, block_size: int) -> None:
        """Drop the last `n` output tokens (those sampled after a stop), and
        the hashes of blocks they completed."""
        if n > 0:
            del self._output_token_ids[-n:]
            self.num_tokens -= n
            del self.block_hashes[self.num_tokens // block_size :]

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return RequestStatus.get_finished_reason(self.status)

    # PRIORITY queues order by (priority, arrival_time, request_id).
    def __lt__(self, other: Request) -> bool:
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority,
            other.arrival_time,
            other.request_id,
        )

    # Hashed by identity, as without `__lt__` in Python; spelled out because
    # a class compiled by mypyc that defines a comparison has no hash
    # otherwise (docs/compiled.md).
    def __hash__(self) -> int:
        return object.__hash__(self)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, computed={self.num_computed_tokens}, "
            f"tokens={self.num_tokens})"
        )
