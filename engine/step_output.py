"""A scheduled step's `SchedulerOutput`: built from what `schedule()`'s
passes chose, then sealed (the connector's metadata, the fence's step
number, and the requests' counters: vLLM's `_update_after_schedule`).
Functions over the scheduler's state (engine/scheduler_state.py), shared by
the full pass and its idle shortcut (scheduler.py), the bulk step
(bulk_step.py) and the steady step (steady_step.py)."""

from __future__ import annotations

from .kv_cache_manager import KVCacheBlocks
from .outputs import CachedRequestData, NewRequestData, SchedulerOutput
from .request import Request
from .scheduler_state import SchedulerState
from .waiting_pass import schedule_waiting


def step_begins(s: SchedulerState) -> None:
    """A new step number; the steady cohort is stale from now on."""
    s.settle_steady()
    s.current_step += 1
    s.steady_epoch += 1
    s.kv_cache_manager.new_step_starts()


def seal(s: SchedulerState, so: SchedulerOutput) -> None:
    """The step is scheduled: the connector's metadata, the fence's step
    number (a step with tokens takes the next), the requests' counters."""
    if s.connector is not None:
        so.kv_connector_metadata = s.connector.build_connector_meta(so)
    if s.defer_block_free and so.total_num_scheduled_tokens > 0:
        s.sched_step_seq += 1
    so.sched_step_seq = s.sched_step_seq
    update_after_schedule(s, so)


def output_after_bulk_running(s: SchedulerState, b: int, long_prefill_threshold: int) -> SchedulerOutput:
    """The rest of a step whose running pass gave `b` requests one token
    each in bulk (steady_step.py, bulk_step.py): the scheduler's own
    waiting pass with what they left of the budgets, and the step's
    output, whose per-request fields hold only what that pass admitted;
    `total_num_scheduled_tokens` counts the `b` tokens too."""
    scheduled_new_reqs: list[Request] = []
    scheduled_resumed_reqs: list[Request] = []
    req_to_new_blocks: dict[str, KVCacheBlocks] = {}
    num_scheduled_tokens: dict[str, int] = {}
    schedule_waiting(
        s,
        s.max_num_scheduled_tokens - b,
        s.scheduler_config.max_num_batched_tokens - b,
        False,
        long_prefill_threshold,
        scheduled_new_reqs,
        scheduled_resumed_reqs,
        req_to_new_blocks,
        num_scheduled_tokens,
    )
    total = b + sum(num_scheduled_tokens.values())
    assert total <= s.max_num_scheduled_tokens
    assert len(s.running) <= s.max_num_running_reqs
    return make_scheduler_output(
        s, scheduled_new_reqs, [], scheduled_resumed_reqs, req_to_new_blocks, num_scheduled_tokens, total
    )


def make_scheduler_output(
    s: SchedulerState,
    scheduled_new_reqs: list[Request],
    scheduled_running_reqs: list[Request],
    scheduled_resumed_reqs: list[Request],
    req_to_new_blocks: dict[str, KVCacheBlocks],
    num_scheduled_tokens: dict[str, int],
    total_num_scheduled_tokens: int,
) -> SchedulerOutput:
    """The step's `SchedulerOutput` (also for the steady step, engine/steady_step.py)."""
    return SchedulerOutput(
        scheduled_new_reqs=_make_new_request_data(scheduled_new_reqs, req_to_new_blocks),
        scheduled_cached_reqs=_make_cached_request_data(
            scheduled_running_reqs, scheduled_resumed_reqs, req_to_new_blocks
        ),
        num_scheduled_tokens=num_scheduled_tokens,
        total_num_scheduled_tokens=total_num_scheduled_tokens,
        scheduled_spec_decode_tokens={},
        num_common_prefix_blocks=[0],
        finished_req_ids=s.finished_req_ids,
        preempted_req_ids=s.reset_preempted_req_ids,
        step_index=s.current_step,
    )


def _make_new_request_data(reqs: list[Request], req_to_new_blocks: dict[str, KVCacheBlocks]) -> list[NewRequestData]:
    return [
        NewRequestData(
            req.request_id,
            req.num_prompt_tokens,
            req_to_new_blocks[req.request_id].get_block_ids(),
            req.num_computed_tokens,
        )
        for req in reqs
    ]


def _make_cached_request_data(
    running_reqs: list[Request],
    resumed_reqs: list[Request],
    req_to_new_blocks: dict[str, KVCacheBlocks],
) -> CachedRequestData:
    data = CachedRequestData()
    for req in running_reqs:
        data.req_ids.append(req.request_id)
        blocks = req_to_new_blocks[req.request_id].blocks
        data.new_block_ids.append([b.block_id for b in blocks] if blocks else None)
        data.num_computed_tokens.append(req.num_computed_tokens)
    for req in resumed_reqs:
        data.req_ids.append(req.request_id)
        data.resumed_req_ids.add(req.request_id)
        data.new_block_ids.append(req_to_new_blocks[req.request_id].get_block_ids())
        data.num_computed_tokens.append(req.num_computed_tokens)
    return data


def update_after_schedule(s: SchedulerState, scheduler_output: SchedulerOutput) -> None:
    """The scheduled requests' counters (vLLM's `_update_after_schedule`)."""
    requests = s.requests
    defer = s.defer_block_free
    seq = s.sched_step_seq
    placeholders = s.adds_output_placeholders
    partial = scheduler_output.partial_prefill_req_ids
    for req_id, n in scheduler_output.num_scheduled_tokens.items():
        request = requests[req_id]
        request.num_computed_tokens += n
        request.num_in_flight_tokens += n
        if defer:
            request.last_sched_seq = seq
        request.is_prefill_chunk = request.num_computed_tokens < (request.num_tokens + request.num_output_placeholders)
        if request.is_prefill_chunk:
            partial.add(req_id)
        else:
            s._inflight_prefills.discard(request)
            if placeholders:
                request.num_output_placeholders += 1
    s.finished_req_ids = set()
    s.reset_preempted_req_ids = set()
