"""The workload spec and the generator that turns it into requests."""

from __future__ import annotations

import typing
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bench.workloads.arrivals import ArrivalSpec, PoissonArrivals
from bench.workloads.lengths import LengthSpec
from bench.workloads.priorities import FixedPriority, PrioritySpec
from engine.records import WorkloadRequest


class WorkloadSpecError(ValueError):
    """A workload spec that does not validate; the message names every bad field."""


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    num_requests: int = Field(ge=1)
    seed: int = 0
    prompt_len: LengthSpec
    output_len: LengthSpec
    arrival: ArrivalSpec = PoissonArrivals(rate=1.0)
    priority: PrioritySpec = FixedPriority()
    # Closed loop: the load driver keeps at most this many requests in flight
    # (vllm bench serve --max-concurrency). None means open loop.
    max_concurrency: int | None = Field(None, ge=1)
    # Added to every arrival time, e.g. to leave a warm-up gap.
    start_time: float = Field(0.0, ge=0)
    request_id_prefix: str = "req-"

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
    prompt_rng, output_rng, arrival_rng, priority_rng = (np.random.default_rng(s) for s in root.spawn(4))
    n = spec.num_requests
    prompts = spec.prompt_len.sample(prompt_rng, n)
    outputs = spec.output_len.sample(output_rng, n)
    offsets = spec.arrival.offsets(arrival_rng, n)
    priorities = spec.priority.sample(priority_rng, n)
    width = len(str(n - 1))
    return [
        WorkloadRequest(
            request_id=f"{spec.request_id_prefix}{i:0{width}d}",
            arrival_time=spec.start_time + offsets[i],
            prompt_len=prompts[i],
            output_len=outputs[i],
            priority=priorities[i],
        )
        for i in range(n)
    ]


def parse_workload_spec(data: dict, where: str = "workload") -> WorkloadSpec:
    """Validate a dict (e.g. from YAML) into a WorkloadSpec, or raise WorkloadSpecError."""
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise WorkloadSpecError(format_validation_error(exc, WorkloadSpec, where)) from None


def format_validation_error(exc: ValidationError, model: type[BaseModel], where: str) -> str:
    lines = [f"invalid {where}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in (where, *err["loc"]))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            allowed = _allowed_fields(model, err["loc"][:-1])
            if allowed:
                msg += f" (allowed fields: {', '.join(allowed)})"
        elif err["type"] == "missing":
            msg = "field required"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def _allowed_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """Walk `loc` through nested models and tagged unions to the model that owns it."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            current = current.model_fields[part].annotation
            continue
        members = [m for m in _union_members(current) if _tag_of(m) == part]
        if not members:
            return []
        current = members[0]
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _union_members(annotation: Any) -> list:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return _union_members(args[0])
    return [a for a in args if isinstance(a, type)]


def _tag_of(model: Any) -> Any:
    field = getattr(model, "model_fields", {}).get("kind")
    return field.default if field is not None else None
