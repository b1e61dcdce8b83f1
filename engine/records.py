"""Plain records that every runtime emits and every report reads.

Times are in seconds on the runtime's clock (virtual in-process, wall in Ray);
`clock` on the run says which. Both runtimes fill the same fields so reports
do not care where a run came from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .token_ids import TokenIds


@dataclass
class RequestRecord:
    request_id: str
    arrival_time: float
    prompt_len: int
    max_tokens: int
    priority: int = 0
    # The first time a scheduler admitted the request (prefill node for P/D).
    first_scheduled_time: float | None = None
    # Time the consumer started / finished waiting for remote KV (P/D only).
    remote_kv_wait_start: float | None = None
    remote_kv_wait_end: float | None = None
    # Arrival time of every output token at the client, in order.
    token_times: list[float] = field(default_factory=list)
    output_token_ids: list[int] | TokenIds = field(default_factory=list)  # TokenIds: runs (in-process)
    finish_time: float | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", "error", or None while running
    num_preemptions: int = 0
    # The TTFT in parts (proxy/breakdown.py PARTS), run seconds; None before the first token.
    ttft_breakdown: dict[str, float] | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def e2el(self) -> float | None:
        return self.finish_time - self.arrival_time if self.finish_time is not None else None

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def remote_kv_wait(self) -> float | None:
        if self.remote_kv_wait_start is None or self.remote_kv_wait_end is None:
            return None
        return self.remote_kv_wait_end - self.remote_kv_wait_start

    @property
    def succeeded(self) -> bool:
        return self.finish_reason in ("stop", "length") and bool(self.token_times)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class StepRecord:
    """One scheduled step of one node."""

    node: str
    time: float  # when the step was scheduled
    step_index: int
    batch_size: int
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_waiting_for_remote_kvs: int
    num_free_blocks: int
    num_deferred_blocks: int
    num_total_blocks: int
    batches_in_flight: int
    num_preemptions_total: int
    num_zero_progress_preemptions_total: int
    duration: float = 0.0  # modelled step time
    # The step's shape beyond the token counts (engine/cost_model.py StepShape):
    # what `disagg-sim calibrate` fits a cost model on.
    context_tokens: int = 0
    decode_context_tokens: int = 0
    prefill_attention_pairs: int = 0

    @property
    def kv_usage(self) -> float:
        usable = self.num_total_blocks
        return 0.0 if usable == 0 else 1.0 - self.num_free_blocks / usable

    def to_dict(self) -> dict[str, Any]:
        # Every field is a plain scalar: read them directly. (`dataclasses.asdict`
        # deep-copies each value; for the ~60,000 steps of a 10,000-request run
        # that took longer than the run itself, benchmarks/cli_speed.py.)
        d = {name: getattr(self, name) for name in STEP_FIELDS}
        d["kv_usage"] = self.kv_usage
        return d


# A step record's field names, in order (its dict and JSON line: bench/results.py).
STEP_FIELDS = tuple(f.name for f in fields(StepRecord))


@dataclass(frozen=True)
class WorkloadRequest:
    """One request a workload releases: what the load driver hands a runtime."""

    request_id: str
    arrival_time: float
    prompt_len: int
    output_len: int
    priority: int = 0
    # Ids of the prompt's prefix blocks (Mooncake traces).
    hash_ids: tuple[int, ...] = ()
    # The prompt's content as (segment key, length) pairs (`engine/prompt.py`)
    # when it shares segments with other prompts; empty: content of its own.
    prompt_segments: tuple[tuple[int, int], ...] = ()
    # Per-request sampling (the OpenAI front door); None: the cluster's sampler setting.
    ignore_eos: bool | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
