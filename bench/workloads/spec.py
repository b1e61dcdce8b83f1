"""The workload spec and the generator that turns it into requests."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bench.errors import InputError, format_validation_error
from bench.workloads.arrivals import ArrivalSpec, PoissonArrivals
from bench.workloads.lengths import LengthSpec
from bench.workloads.prefixes import Sessions, SharedPrefix, apply_prefix_structure
from bench.workloads.priorities import FixedPriority, PrioritySpec
from engine.records import WorkloadRequest


class WorkloadSpecError(InputError):
    """A workload spec that does not validate; the message names every bad field."""


# Requests per workload or trace: a million requests is hours of simulated
# serving; more is almost certainly a typo (and would exhaust memory).
MAX_REQUESTS = 1_000_000


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    num_requests: int = Field(ge=1, le=MAX_REQUESTS)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    prompt_len: LengthSpec
    output_len: LengthSpec
    arrival: ArrivalSpec = PoissonArrivals(rate=1.0)
    priority: PrioritySpec = FixedPriority()
    # Closed loop: the load driver keeps at most this many requests in flight
    # (vllm bench serve --max-concurrency). None means open loop.
    max_concurrency: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    # Added to every arrival time (seconds), e.g. to leave a warm-up gap.
    start_time: float = Field(0.0, ge=0, le=1e7)
    request_id_prefix: str = Field("req-", max_length=64, pattern=r"^[A-Za-z0-9._-]*$")
    # Content shared between prompts, for prefix caching (bench/workloads/prefixes.py):
    # `prompt_len` is then each request's own part.
    shared_prefix: SharedPrefix | None = None
    sessions: Sessions | None = None

    @field_validator("prompt_len", "output_len", mode="before")
    @classmethod
    def _int_means_fixed(cls, v: Any) -> Any:
        # `prompt_len: 512` in YAML reads naturally as a fixed length.
        if isinstance(v, int) and not isinstance(v, bool):
            return {"kind": "fixed", "value": v}
        return v

    @field_validator("priority", mode="before")
    @classmethod
    def _int_means_fixed_priority(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            return {"kind": "fixed", "value": v}
        return v


def generate_workload(spec: WorkloadSpec, seed: int | None = None) -> list[WorkloadRequest]:
    """Draw `spec.num_requests` requests, deterministically from `seed` (default spec.seed).

    Prompt lengths, output lengths, arrivals and priorities each use their own
    child stream of the seed, so changing one part leaves the others as they were.
    """
    root = np.random.SeedSequence(spec.seed if seed is None else seed)
    prompt_rng, output_rng, arrival_rng, priority_rng, prefix_rng = (np.random.default_rng(s) for s in root.spawn(5))
    n = spec.num_requests
    prompts = spec.prompt_len.sample(prompt_rng, n)
    outputs = spec.output_len.sample(output_rng, n)
    offsets = spec.arrival.offsets(arrival_rng, n)
    priorities = spec.priority.sample(priority_rng, n)
    width = len(str(n - 1))
    requests = [
        WorkloadRequest(
            request_id=f"{spec.request_id_prefix}{i:0{width}d}",
            arrival_time=spec.start_time + offsets[i],
            prompt_len=prompts[i],
            output_len=outputs[i],
            priority=priorities[i],
        )
        for i in range(n)
    ]
    return apply_prefix_structure(
        requests, spec.shared_prefix, spec.sessions, prefix_rng, spec.seed if seed is None else seed
    )


def parse_workload_spec(data: dict, where: str = "workload") -> WorkloadSpec:
    """Validate a dict (e.g. from YAML) into a WorkloadSpec, or raise WorkloadSpecError."""
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise WorkloadSpecError(
            format_validation_error(exc, WorkloadSpec, f"invalid {where}", prefix=(where,))
        ) from None
