"""The published measurements (published.yaml): one point per `vllm bench
serve` run, its configuration as published and its reported numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bench.errors import InputError, format_validation_error

DATASET = Path(__file__).resolve().parent / "published.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class Published(_Strict):
    """What the run printed (vllm bench serve's names and units)."""

    completed: int = Field(ge=1)
    duration_s: float = Field(gt=0)
    total_input_tokens: int = Field(ge=1)
    total_output_tokens: int = Field(ge=1)
    output_throughput: float = Field(gt=0)
    total_token_throughput: float = Field(gt=0)
    mean_ttft_ms: float = Field(gt=0)
    mean_tpot_ms: float = Field(gt=0)
    mean_itl_ms: float = Field(gt=0)


class Source(_Strict):
    url: str = Field(pattern=r"^https://")
    quote: str = Field(min_length=1)


class Point(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    model: str  # engine/data/models.json
    gpu: str  # engine/data/gpus.json
    tp: int = Field(1, ge=1)
    vllm_version: str
    dataset: Literal["random", "sharegpt"]
    random_input_len: int | None = Field(None, ge=1)
    random_output_len: int | None = Field(None, ge=1)
    bench: str
    serve: str
    num_prompts: int = Field(ge=1)
    request_rate: float | Literal["inf"] = "inf"
    max_concurrency: int | None = Field(None, ge=1)
    prefix_caching: bool = True
    published: Published
    source: Source

    @model_validator(mode="after")
    def _lengths(self) -> Point:
        if self.dataset == "random" and (self.random_input_len is None or self.random_output_len is None):
            raise ValueError("dataset 'random' needs random_input_len and random_output_len")
        if self.published.completed != self.num_prompts:
            raise ValueError(f"published.completed={self.published.completed} != num_prompts={self.num_prompts}")
        return self

    @property
    def mean_input_len(self) -> float:
        return self.published.total_input_tokens / self.published.completed

    @property
    def mean_output_len(self) -> float:
        return self.published.total_output_tokens / self.published.completed


def load_points(path: str | Path = DATASET) -> list[Point]:
    """Every point of the file, validated; a bad one is one line naming it."""
    with open(path, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    if not isinstance(raw, dict) or not isinstance(raw.get("points"), list):
        raise InputError(f"{path}: expected a mapping with a `points` list")
    points = []
    for i, item in enumerate(raw["points"]):
        try:
            points.append(Point.model_validate(item))
        except ValidationError as exc:
            raise InputError(format_validation_error(exc, Point, f"{path}: points[{i}]")) from None
    ids = [p.id for p in points]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise InputError(f"{path}: duplicate point ids {dup}; allowed: unique ids")
    return points
