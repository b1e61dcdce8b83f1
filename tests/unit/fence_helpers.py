"""Shared helpers for the hand-driven scheduler tests (vLLM's
`tests/v1/core/test_deferred_block_free.py` style)."""

from __future__ import annotations

from engine.outputs import ModelRunnerOutput
from engine.testing import create_requests, create_scheduler


class AllocationSpy:
    """Counts `allocate_slots` calls and makes exactly the Nth one return
    None; every other call goes to the real allocator."""

    def __init__(self, scheduler, fail_call: int | None = None) -> None:
        self.kvm = scheduler.kv_cache_manager
        self.real = self.kvm.allocate_slots
        self.fail_call = fail_call
        self.call_count = 0
        self.kvm.allocate_slots = self  # instance attribute shadows the method

    def __call__(self, *args, **kwargs):
        self.call_count += 1
        if self.call_count == self.fail_call:
            return None
        return self.real(*args, **kwargs)

    def reset(self, fail_call: int | None) -> None:
        self.call_count = 0
        self.fail_call = fail_call


def output_for(scheduler_output, token_id: int = 0, prefill_chunks: set[str] = frozenset()) -> ModelRunnerOutput:
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[] if r in prefill_chunks else [token_id] for r in req_ids],
    )


def fenced_scheduler(policy: str = "fcfs", **kw):
    """An async scheduler with the fence forced on, as vLLM's tests build it."""
    kw.setdefault("async_scheduling", True)
    return create_scheduler(policy=policy, defer_block_free=True, **kw)


__all__ = ["AllocationSpy", "output_for", "fenced_scheduler", "create_requests", "create_scheduler"]
