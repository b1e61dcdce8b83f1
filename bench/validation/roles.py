"""Which fits a published point takes part in (bench/validation/fit.py): the
roles its configuration gives it, by GPU class, load and size of replay."""

from __future__ import annotations

from engine.model_shape import get_gpu

from .dataset import Point

CHEAP_REPLAY_TOKENS = 30_000
# In flight at once from which a point's steps fit the host time per row (is_large_batch).
LARGE_BATCH_ROWS = 64


def gpu_class(point: Point) -> str:
    return get_gpu(point.gpu).gpu_class


def is_pd(point: Point) -> bool:
    return point.pd is not None


def is_engine_bound(point: Point) -> bool:
    load = point.max_concurrency is None or point.max_concurrency >= 16
    return not is_pd(point) and point.dataset == "random" and point.mean_input_len >= 1000 and load


def is_low_load(point: Point) -> bool:
    return not is_pd(point) and (point.max_concurrency or point.num_prompts) <= 16


def is_large_batch(point: Point) -> bool:
    """Aggregated runs of >= 64 requests in flight (a closed loop of 64, or 64 prompts at once): their steps
    carry tens to hundreds of rows, so the host time per row is a share of each step."""
    rows = point.max_concurrency if point.max_concurrency is not None else point.num_prompts
    return not is_pd(point) and rows >= LARGE_BATCH_ROWS


def is_cheap_replay(point: Point) -> bool:
    return not is_pd(point) and point.num_prompts * point.mean_output_len <= CHEAP_REPLAY_TOKENS
