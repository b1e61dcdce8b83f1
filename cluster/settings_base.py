"""What every scenario settings model shares: strictness (unknown keys and
infinite or NaN numbers refused) and the upper bounds on sizes and times."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError, ValidatorFunctionWrapHandler

# Upper bounds on sizes and times. They are far above anything a simulation
# of one serving cluster needs and low enough that a typo (an extra few zeros,
# `1e12`, `inf`) is refused at load instead of exhausting memory or stalling
# the event queue mid-run.
MAX_BLOCKS = 1_000_000  # KV blocks per node (an 80 GB GPU holds ~30k 16-token blocks of an 8B model)
MAX_TOKENS = 10_000_000  # max_model_len, token budgets, thresholds
MAX_SEQS = 65_536
MAX_NODES = 64  # per node group
MAX_PP = 64
MAX_LINK_MS = 600_000.0  # ten minutes of one-way delay or jitter
MIN_BANDWIDTH_MBPS = 0.001  # 1 kB/s; slower would make one block take hours
MAX_BANDWIDTH_MBPS = 1e9
MAX_RUN_S = 86_400.0  # a day of run time for timeouts, deadlines, holds
MAX_SEED = 2**32 - 1  # numpy's SeedSequence and the link seeds take non-negative ints


def int_or_auto(v: object, handler: ValidatorFunctionWrapHandler, low: int, high: int) -> object:
    """One error for an int-or-"auto" field, not one per union branch."""
    if v == "auto":
        return v
    try:
        return handler(v)
    except ValidationError:
        raise ValueError(f"allowed: an int in [{low}, {high}] or 'auto'") from None


class StrictModel(BaseModel):
    # allow_inf_nan=False: an infinite or NaN number is never a usable setting
    # (NaN corrupts the event queue's ordering; inf never fires).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
