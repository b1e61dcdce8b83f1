"""The published measurements (published.yaml): one point per `vllm bench
serve` run, its configuration as published and its reported numbers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bench.errors import InputError, format_validation_error

DATASET = Path(__file__).resolve().parent / "published.yaml"
INDEPENDENT = Path(__file__).resolve().parent / "independent.yaml"
DEFAULT_LAB = "gpustack"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class Published(_Strict):
    """What the run printed (vllm bench serve's names and units). published.yaml
    holds the nine mean/total keys of every run; independent.yaml only what its
    source printed, so every key is optional here and a point is scored on the
    metrics it has."""

    completed: int | None = Field(None, ge=1)
    duration_s: float | None = Field(None, gt=0)
    total_input_tokens: int | None = Field(None, ge=1)
    total_output_tokens: int | None = Field(None, ge=1)
    request_throughput: float | None = Field(None, gt=0)
    output_throughput: float | None = Field(None, gt=0)
    total_token_throughput: float | None = Field(None, gt=0)
    mean_ttft_ms: float | None = Field(None, gt=0)
    median_ttft_ms: float | None = Field(None, gt=0)
    p95_ttft_ms: float | None = Field(None, gt=0)
    p99_ttft_ms: float | None = Field(None, gt=0)
    mean_tpot_ms: float | None = Field(None, gt=0)
    median_tpot_ms: float | None = Field(None, gt=0)
    p95_tpot_ms: float | None = Field(None, gt=0)
    p99_tpot_ms: float | None = Field(None, gt=0)
    mean_itl_ms: float | None = Field(None, gt=0)
    median_itl_ms: float | None = Field(None, gt=0)
    p95_itl_ms: float | None = Field(None, gt=0)
    p99_itl_ms: float | None = Field(None, gt=0)
    mean_e2el_ms: float | None = Field(None, gt=0)
    median_e2el_ms: float | None = Field(None, gt=0)
    p95_e2el_ms: float | None = Field(None, gt=0)
    p99_e2el_ms: float | None = Field(None, gt=0)


# The keys every published.yaml point carries (its format since issue 11).
REQUIRED_IN_PUBLISHED_YAML = (
    "completed",
    "duration_s",
    "total_input_tokens",
    "total_output_tokens",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
)


class Source(_Strict):
    url: str = Field(pattern=r"^https://")
    quote: str = Field(min_length=1)
    # The independent source (lab, vendor, author) for leave-one-source-out;
    # published.yaml's points are all GPUStack's performance lab.
    lab: str = Field(DEFAULT_LAB, min_length=1)


class Point(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    model: str  # engine/data/models.json
    gpu: str  # engine/data/gpus.json
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    # Data-parallel engines behind one router (aggregated points).
    replicas: int = Field(1, ge=1)
    vllm_version: str
    engine: str | None = None
    endpoint: str | None = None
    quantization: str | None = None
    ignore_eos: bool | None = None
    burstiness: float | None = Field(None, gt=0)
    expert_parallel: bool | None = None
    # The engine scheduled asynchronously (vLLM's --async-scheduling); unset: the version's default.
    async_scheduling: bool | None = None
    dataset: Literal["random", "sharegpt", "hf-sharegpt"]
    random_input_len: int | None = Field(None, ge=1)
    random_output_len: int | None = Field(None, ge=1)
    bench: str
    serve: str
    num_prompts: int = Field(ge=1)
    request_rate: float | Literal["inf"] = "inf"
    max_concurrency: int | None = Field(None, ge=1)
    prefix_caching: bool = True
    # P/D points: the prefill/decode layout as published (phase 2 simulates them).
    pd: dict | None = None
    notes: str | None = None
    published: Published
    source: Source

    @model_validator(mode="after")
    def _lengths(self) -> Point:
        if self.dataset == "random" and (self.random_input_len is None or self.random_output_len is None):
            raise ValueError("dataset 'random' needs random_input_len and random_output_len")
        done = self.published.completed
        if done is not None and done != self.num_prompts:
            raise ValueError(f"published.completed={done} != num_prompts={self.num_prompts}")
        return self

    @property
    def lab(self) -> str:
        return self.source.lab

    @property
    def mean_input_len(self) -> float:
        pub = self.published
        if pub.total_input_tokens and pub.completed:
            return pub.total_input_tokens / pub.completed
        return float(self.random_input_len or 0)

    @property
    def mean_output_len(self) -> float:
        pub = self.published
        if pub.total_output_tokens and pub.completed:
            return pub.total_output_tokens / pub.completed
        return float(self.random_output_len or 0)


def load_points(path: str | Path = DATASET) -> list[Point]:
    """Every point of the file, validated; a bad one is one line naming it."""
    with open(path, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    if not isinstance(raw, dict) or not isinstance(raw.get("points"), list):
        raise InputError(f"{path}: expected a mapping with a `points` list")
    points = []
    strict = Path(path).name == DATASET.name
    for i, item in enumerate(raw["points"]):
        try:
            point = Point.model_validate(item)
        except ValidationError as exc:
            raise InputError(format_validation_error(exc, Point, f"{path}: points[{i}]")) from None
        missing = [k for k in REQUIRED_IN_PUBLISHED_YAML if strict and getattr(point.published, k) is None]
        if missing:
            raise InputError(f"{path}: points[{i}] ({point.id}): published is missing {missing}")
        points.append(point)
    _unique(points, str(path))
    return points


def load_all(paths: Sequence[str | Path] = (DATASET, INDEPENDENT)) -> list[Point]:
    """The points of every file that exists, ids unique across them."""
    points = [p for path in paths if Path(path).exists() for p in load_points(path)]
    _unique(points, " + ".join(str(p) for p in paths))
    return points


def _unique(points: Sequence[Point], where: str) -> None:
    ids = [p.id for p in points]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise InputError(f"{where}: duplicate point ids {dup}; allowed: unique ids")
