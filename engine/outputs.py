"""The messages between scheduler, executor and front end, shaped like vLLM's
`SchedulerOutput` (`vllm/v1/core/sched/output.py`), `ModelRunnerOutput` and
`KVConnectorOutput` (`vllm/v1/outputs.py`) and `EngineCoreOutput`."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, final


@dataclass(slots=True)
class NewRequestData:
    req_id: str
    prompt_len: int
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)
    new_block_ids: list[list[int] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]
    num_common_prefix_blocks: list[int]
    finished_req_ids: set[str]
    preempted_req_ids: set[str]
    kv_connector_metadata: Any = None
    # Simulator extras: the fence counter after this step was scheduled, and a
    # per-scheduler step number (empty steps included) for traces.
    sched_step_seq: int = 0
    step_index: int = 0
    # Requests whose chunk leaves their prompt unfinished: the worker samples
    # nothing for them (vLLM's runner derives this from its own token counts).
    partial_prefill_req_ids: set[str] = field(default_factory=set)
    # The steady-decode fast paths (engine/steady_decode.py): running requests
    # that decode one token each in this step, kept out of the per-request
    # fields above and handled in bulk (a `SteadyPart`), or None.
    steady: Any = None

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        return cls([], CachedRequestData(), {}, 0, {}, [], set(), set())


@dataclass
class KVConnectorOutput:
    # Any set-like collection (vLLM types them `set[str]`): the conformance
    # harness passes dict key views, which iterate in a known order; the
    # compiled build (docs/compiled.md) checks the declared type at run time.
    finished_sending: AbstractSet[str] | None = None
    finished_recving: AbstractSet[str] | None = None
    failed_recving: AbstractSet[str] | None = None
    invalid_block_ids: set[int] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not (self.finished_sending or self.finished_recving or self.failed_recving or self.invalid_block_ids)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    kv_connector_output: KVConnectorOutput | None = None

    @classmethod
    def empty(cls) -> ModelRunnerOutput:
        return cls([], {}, [])


@dataclass(slots=True)
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    num_cached_tokens: int = 0
    # Simulator extra, set on the finishing output: how often it was preempted.
    num_preemptions: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput | SteadyTokens] = field(default_factory=list)
    finished_requests: set[str] = field(default_factory=set)


@final  # (so that `type(o) is SteadyTokens` tells the rest apart for mypy)
class SteadyTokens:
    """One token for each of `request_ids` in one step, its next output
    (engine/steady_decode.py): what a step's one-token outputs of steady
    decode come to, as one object instead of one `EngineCoreOutput` (and one
    proxy event) per request. Only the in-process runtime makes and reads
    these."""

    __slots__ = ("request_ids",)
    finish_reason = None

    def __init__(self, request_ids: list[str]) -> None:
        self.request_ids = request_ids
