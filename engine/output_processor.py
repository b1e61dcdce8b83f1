"""The scheduler's second half: `update_from_output`, and finishes and
aborts (vLLM 0.33.0 `sched.py:2259-2676`), as functions over the
scheduler's state (engine/scheduler_state.py); `Scheduler` keeps vLLM's
method names for them. The frees they lead to: free_path.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .free_path import drain_deferred_frees, free_blocks, free_request
from .kv_load_failures import update_requests_with_invalid_blocks
from .outputs import (
    EngineCoreOutput,
    EngineCoreOutputs,
    KVConnectorOutput,
    ModelRunnerOutput,
    SchedulerOutput,
    SteadyTokens,
)
from .request import Request, RequestStatus
from .scheduler_state import SchedulerState
from .stop_checker import check_stop


# ----------------------------------------------------------------- update
def update_from_output(
    s: SchedulerState,
    scheduler_output: SchedulerOutput,
    model_runner_output: ModelRunnerOutput,
) -> dict[int, EngineCoreOutputs]:
    if scheduler_output.steady is None:
        s.settle_steady()
    num_scheduled_tokens = scheduler_output.num_scheduled_tokens
    sampled_token_ids = model_runner_output.sampled_token_ids
    kv_connector_output = model_runner_output.kv_connector_output

    # The fence moves first, then the frees it unblocks.
    if s.defer_block_free and scheduler_output.total_num_scheduled_tokens > 0:
        s.processed_step_seq += 1
        drain_deferred_frees(s)

    failed_kv_load_req_ids: set[str] = set()
    if kv_connector_output and kv_connector_output.failed_recving:
        failed_kv_load_req_ids.update(_handle_failed_recving(s, kv_connector_output.failed_recving))
    if kv_connector_output and kv_connector_output.invalid_block_ids:
        failed_kv_load_req_ids.update(
            _handle_invalid_blocks(s, kv_connector_output.invalid_block_ids, num_scheduled_tokens)
        )

    outputs: list[Any] = []
    stopped_running: set[Request] = set()
    stopped_preempted: set[Request] = set()
    if scheduler_output.steady is not None:
        # The step's steady-decode requests first (they lead the running
        # order): one token each, in bulk (engine/steady_step.py; the part
        # brings its own update: no import of it here, which would be circular).
        outputs.extend(scheduler_output.steady.update(s, stopped_running, stopped_preempted, failed_kv_load_req_ids))
    requests = s.requests
    max_model_len = s.max_model_len
    # One-token outputs that finish nothing, as one `SteadyTokens` (the
    # in-process runtime's proxy keeps such tokens as runs).
    bulk: list[str] | None = [] if s.bulk_token_outputs else None
    req_id_to_index = model_runner_output.req_id_to_index
    kvm = s.kv_cache_manager
    caching = kvm.enable_caching
    cache_blocks = kvm.cache_blocks
    num_cached_block = kvm.num_cached_block
    block_size = s.block_size
    for req_id, n in num_scheduled_tokens.items():
        request = requests.get(req_id)
        output_is_stale = False
        if request is not None:
            request.num_in_flight_tokens -= n
            if request.num_stale_output_tokens > 0:
                output_is_stale = True
                request.num_stale_output_tokens -= n
                assert request.num_stale_output_tokens >= 0
        if req_id in failed_kv_load_req_ids:
            continue
        if request is None or request.status > RequestStatus.PREEMPTED:
            continue
        if output_is_stale and request.drop_stale_output:
            continue

        new_token_ids = sampled_token_ids[req_id_to_index[req_id]] if sampled_token_ids else []
        if not new_token_ids:
            continue
        status_before_stop = request.status
        had_placeholders = request.num_output_placeholders > 0
        if len(new_token_ids) == 1:
            # The common decode case, inlined: one token, nothing to trim.
            request._output_token_ids.append(new_token_ids[0])
            request.num_tokens += 1
            stopped = check_stop(request, max_model_len)
            if not output_is_stale and request.num_output_placeholders > 0:
                request.num_output_placeholders -= 1
        else:
            new_token_ids, stopped = _update_request_with_output(s, request, list(new_token_ids), output_is_stale)
        if caching and had_placeholders and not output_is_stale and status_before_stop == RequestStatus.RUNNING:
            # With placeholders, allocate_slots could not cache the blocks
            # these tokens complete (their ids were not known yet).
            upto = request.num_computed_tokens - request.num_in_flight_tokens
            # (`cache_blocks` returns at once unless a block completed: most tokens.)
            if min(upto, request.num_tokens) // block_size > num_cached_block.get(req_id, 0):
                cache_blocks(request, upto)
        if not stopped:
            if bulk is not None and len(new_token_ids) == 1:
                bulk.append(req_id)
            else:
                outputs.append(EngineCoreOutput(req_id, new_token_ids, None, request.stop_reason))
            continue
        finish_reason = request.get_finished_reason()
        kv_transfer_params = free_request(s, request)
        if status_before_stop == RequestStatus.RUNNING:
            stopped_running.add(request)
        else:
            stopped_preempted.add(request)
        outputs.append(
            EngineCoreOutput(
                request_id=req_id,
                new_token_ids=new_token_ids,
                finish_reason=finish_reason,
                stop_reason=request.stop_reason,
                kv_transfer_params=kv_transfer_params,
                num_preemptions=request.num_preemptions,
            )
        )
    if bulk:
        # Ahead of the other outputs, in one object with the steady
        # part's (the proxy records a batch's tokens before its finishes
        # either way: they are other requests').
        if outputs and type(outputs[0]) is SteadyTokens:
            outputs[0] = SteadyTokens(outputs[0].request_ids + bulk)
        else:
            outputs.insert(0, SteadyTokens(bulk))

    if stopped_running:
        s.running = [r for r in s.running if r not in stopped_running]
    if stopped_preempted:
        s.waiting.remove_requests(stopped_preempted)
        s.kv_holding_waiting.remove_requests(stopped_preempted)
        s.deferred_waiting.difference_update(stopped_preempted)

    if failed_kv_load_req_ids and not s.recompute_kv_load_failures:
        for request in finish_requests(s, failed_kv_load_req_ids, RequestStatus.FINISHED_ERROR):
            outputs.append(EngineCoreOutput(request.request_id, [], finish_reason=request.get_finished_reason()))

    if kv_connector_output is not None:
        _update_from_kv_xfer_finished(s, kv_connector_output)

    result: dict[int, EngineCoreOutputs] = {}
    if outputs:
        result[0] = EngineCoreOutputs(outputs=outputs)
    return result


def _update_request_with_output(
    s: SchedulerState, request: Request, new_token_ids: list[int], is_stale: bool
) -> tuple[list[int], bool]:
    num_new_tokens = len(new_token_ids)
    stopped = False
    for num_new, token_id in enumerate(new_token_ids, 1):
        request.append_output_token_ids(token_id)
        if check_stop(request, s.max_model_len):
            stopped = True
            if not is_stale:
                request.num_computed_tokens -= num_new_tokens - num_new
            del new_token_ids[num_new:]
            break
    if not is_stale and request.num_output_placeholders > 0:
        request.num_output_placeholders -= num_new_tokens
        assert request.num_output_placeholders >= 0
    return new_token_ids, stopped


def _handle_failed_recving(s: SchedulerState, failed_req_ids: Iterable[str]) -> set[str]:
    affected: set[str] = set()
    for req_id in failed_req_ids:
        request = s.requests.get(req_id)
        if request is not None and request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            affected.add(req_id)
            if s.recompute_kv_load_failures:
                request.num_computed_tokens = 0
                s.failed_recving_kv_req_ids.add(req_id)
    return set() if s.recompute_kv_load_failures else affected


def _handle_invalid_blocks(
    s: SchedulerState, invalid_block_ids: set[int], num_scheduled_tokens: dict[str, int]
) -> set[str]:
    """Requests whose computed blocks did not all load: async loads (not
    cached yet) and running requests (sync loads; their invalid blocks
    leave the prefix cache under the `fail` policy). Returns the ids the
    output loop skips: every affected one under `fail` (they finish with an
    error), the running ones under `recompute` (the async ones recompute
    once their load is reported done)."""
    kvm = s.kv_cache_manager
    loading = [r for r in s.kv_holding_waiting if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
    async_failed, _ = update_requests_with_invalid_blocks(
        kvm, loading, invalid_block_ids, num_scheduled_tokens, evict_blocks=False
    )
    sync_failed, to_evict = update_requests_with_invalid_blocks(
        kvm, s.running, invalid_block_ids, num_scheduled_tokens, evict_blocks=True
    )
    if not async_failed and not sync_failed:
        return set()
    if to_evict and not s.recompute_kv_load_failures:
        kvm.evict_blocks(to_evict)
    if not s.recompute_kv_load_failures:
        return async_failed | sync_failed
    s.failed_recving_kv_req_ids |= async_failed
    return sync_failed


def _update_from_kv_xfer_finished(s: SchedulerState, out: KVConnectorOutput) -> None:
    if s.connector is not None:
        s.connector.update_connector_output(out)
    for req_id in out.finished_recving or ():
        request = s.requests.get(req_id)
        if request is None:
            raise ValueError(f"finished_recving names unknown request {req_id!r}")
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            s.finished_recving_kv_req_ids.add(req_id)
        else:
            assert request.is_finished(), f"{req_id} finished receiving in state {request.status.name}"
            free_blocks(s, request)
    for req_id in out.finished_sending or ():
        request = s.requests.get(req_id)
        if request is None:
            raise ValueError(f"finished_sending names unknown request {req_id!r}")
        free_blocks(s, request)


# ------------------------------------------------------- finish and abort
def finish_requests(
    s: SchedulerState, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
) -> list[Request]:
    """Finish requests from outside (aborts, errors); ignores unknown and
    already-finished ids; returns the requests it finished."""
    if not RequestStatus.is_finished(finished_status):
        raise ValueError(f"finished_status={finished_status!r} is not a finished status")
    s.settle_steady()
    if isinstance(request_ids, str):
        request_ids = (request_ids,)
    elif request_ids is None:
        request_ids = list(s.requests)
    else:
        request_ids = list(dict.fromkeys(request_ids))

    running_to_remove: set[Request] = set()
    waiting_to_remove: list[Request] = []
    valid: list[Request] = []
    for req_id in request_ids:
        request = s.requests.get(req_id)
        if request is None or request.is_finished():
            continue
        valid.append(request)
        if request.status == RequestStatus.RUNNING:
            running_to_remove.add(request)
        else:
            waiting_to_remove.append(request)
    if running_to_remove:
        s.running = [r for r in s.running if r not in running_to_remove]
        # Running requests left outside the steady paths: the steady-decode
        # cohort is stale, and a steady step in flight must skip them
        # (engine/steady_step.py `update_steady`).
        s.steady_epoch += 1
    if waiting_to_remove:
        s.waiting.remove_requests(waiting_to_remove)
        s.kv_holding_waiting.remove_requests(waiting_to_remove)
        s.deferred_waiting.difference_update(waiting_to_remove)

    for request in valid:
        delay_free = False
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            # A started load keeps its blocks until the receive completes.
            delay_free = request.request_id not in s.finished_recving_kv_req_ids
            s.finished_recving_kv_req_ids.discard(request.request_id)
            s.failed_recving_kv_req_ids.discard(request.request_id)
        request.status = finished_status
        free_request(s, request, delay_free_blocks=delay_free)
    return valid


def get_counters(s: SchedulerState) -> dict[str, int]:
    kvm = s.kv_cache_manager
    s.counters.num_allocate_slots_calls = kvm.num_allocate_slots_calls
    counters = s.counters.to_dict()
    if kvm.enable_caching:
        stats = kvm.prefix_cache_stats
        counters.update(
            prefix_cache_queries=stats.queries,
            prefix_cache_hits=stats.hits,
            prefix_cache_preempted_queries=stats.preempted_queries,
            prefix_cache_preempted_hits=stats.preempted_hits,
        )
    return counters
