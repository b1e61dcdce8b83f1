"""Freeing a finished or preempted request's blocks, and the deferred-free
fence (vLLM 0.33.0 `sched.py:2964-3119`, `3556-3582`): while an in-flight
step may still write a request's blocks, they wait in `deferred_frees` until
that step's output has been processed. Functions over the scheduler's state
(engine/scheduler_state.py), shared by the running pass's preemptions, output
processing, aborts and the steady paths."""

from __future__ import annotations

from typing import Any

from .request import Request
from .scheduler_state import SchedulerState


def free_request(s: SchedulerState, request: Request, delay_free_blocks: bool = False) -> dict[str, Any] | None:
    """A finished request leaves: the connector's say on its blocks (and the
    KV transfer parameters it returns), then its blocks, unless delayed."""
    assert request.is_finished()
    s._inflight_prefills.discard(request)
    kv_xfer_params = None
    if s.connector is not None:
        # Block ids handed to the connector are clipped to the computed tokens.
        n_blocks = -(-request.num_computed_tokens // s.block_size)
        block_ids = s.kv_cache_manager.get_block_ids(request.request_id)[:n_blocks]
        connector_delay, kv_xfer_params = s.connector.request_finished(request, block_ids)
        delay_free_blocks |= connector_delay
    s.finished_req_ids.add(request.request_id)
    if not delay_free_blocks:
        free_blocks(s, request)
    return kv_xfer_params


def free_blocks(s: SchedulerState, request: Request) -> None:
    assert request.is_finished()
    free_request_blocks(s, request)
    del s.requests[request.request_id]


def free_request_blocks(s: SchedulerState, request: Request) -> None:
    """Free now, or — when an in-flight step may still write the blocks —
    drop the bookkeeping at once and park the blocks in `deferred_frees`
    until the newest scheduled step's output has been processed."""
    if s._request_blocks_can_be_freed(request):
        s.kv_cache_manager.free(request)
        return
    blocks = s.kv_cache_manager.pop_blocks_for_free(request)
    if blocks:
        s.deferred_frees.append((s.sched_step_seq, blocks))
        c = s.counters
        c.deferred_free_blocks += len(blocks)
        if c.deferred_free_blocks > c.deferred_free_blocks_peak:
            c.deferred_free_blocks_peak = c.deferred_free_blocks


def drain_deferred_frees(s: SchedulerState) -> None:
    """Stop at the first unsatisfied fence (0.33.0 does not scan past it)."""
    deferred = s.deferred_frees
    pool = s.kv_cache_manager.block_pool
    c = s.counters
    while deferred:
        fence, _ = deferred[0]
        if fence > s.processed_step_seq:
            break
        _, blocks = deferred.popleft()
        pool.free_blocks(reversed(blocks))
        c.deferred_free_blocks -= len(blocks)
        c.num_blocks_freed_by_drain += len(blocks)
