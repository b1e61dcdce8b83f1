"""The waiting-queue pass of `Scheduler.schedule()` (vLLM 0.33.0
`sched.py:1049-1616`): the KV-holding queue first, the active-request cap,
connector matches and async KV loads (WAITING_FOR_REMOTE_KVS and promotion on
`finished_recving`), chunked prefill, and the head-of-line `break` on a
failed allocation. It never preempts. Functions over the scheduler's state
(engine/scheduler_state.py)."""

from __future__ import annotations

from collections import deque

from .kv_cache_manager import EMPTY_BLOCKS, KVCacheBlocks
from .request import Request, RequestStatus
from .request_queue import FCFSRequestQueue, PriorityRequestQueue
from .scheduler_state import SchedulerState


def schedule_waiting(
    s: SchedulerState,
    token_budget: int,
    input_budget: int,
    defer_prefills: bool,
    long_prefill_threshold: int,
    scheduled_new_reqs: list[Request],
    scheduled_resumed_reqs: list[Request],
    req_to_new_blocks: dict[str, KVCacheBlocks],
    num_scheduled_tokens: dict[str, int],
) -> int:
    kvm = s.kv_cache_manager
    connector = s.connector
    skipped_waiting: deque[Request] = deque()
    skipped_kv_holding: deque[Request] = deque()

    def skip_request(queue: FCFSRequestQueue | PriorityRequestQueue) -> None:
        r = queue.pop_request()
        s.deferred_waiting.add(r)
        (skipped_kv_holding if s._holds_kv_blocks(r) else skipped_waiting).appendleft(r)

    while token_budget > 0:
        queue = s.kv_holding_waiting if s.kv_holding_waiting else s.waiting
        if not queue or input_budget <= 0:
            break
        if len(s.running) >= s.max_num_active_reqs:
            break
        request = queue.peek_request()
        if not _handle_blocked_waiting_request(s, request):
            skip_request(queue)
            continue
        if request.num_stale_output_tokens and not request.drop_stale_output:
            # Its in-flight output will still deliver a position; resuming
            # now could sample that position twice.
            skip_request(queue)
            continue

        num_external_computed_tokens = 0
        load_kv_async = False
        did_prefix_cache_lookup = False
        if request.num_computed_tokens == 0:
            did_prefix_cache_lookup = True
            new_computed_blocks, num_new_local_computed_tokens = kvm.get_computed_blocks(request)
            if connector is not None:
                ext_tokens, load_kv_async = connector.get_num_new_matched_tokens(request, num_new_local_computed_tokens)
                if ext_tokens is None:
                    skip_request(queue)
                    continue
                num_external_computed_tokens = ext_tokens
            num_computed_tokens = num_new_local_computed_tokens + num_external_computed_tokens
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_computed_tokens
        else:
            new_computed_blocks, num_new_local_computed_tokens = EMPTY_BLOCKS, 0
            num_computed_tokens = request.num_computed_tokens

        if load_kv_async:
            num_new_tokens = 0
        elif defer_prefills and num_computed_tokens < request.num_tokens - 1:
            break
        else:
            request_token_budget = min(token_budget, input_budget)
            num_new_tokens = request.num_tokens - num_computed_tokens
            if 0 < long_prefill_threshold < num_new_tokens:
                num_new_tokens = long_prefill_threshold
            if not s.scheduler_config.enable_chunked_prefill and num_new_tokens > request_token_budget:
                break
            num_new_tokens = min(num_new_tokens, request_token_budget)

        reserved_blocks = _inflight_prefill_reserved_blocks(s) if load_kv_async else 0
        new_blocks = kvm.allocate_slots(
            request,
            num_new_tokens,
            num_new_computed_tokens=num_new_local_computed_tokens,
            new_computed_blocks=new_computed_blocks,
            num_lookahead_tokens=0 if load_kv_async else s.num_lookahead_tokens,
            num_external_computed_tokens=num_external_computed_tokens,
            delay_cache_blocks=load_kv_async,
            full_sequence_must_fit=s.scheduler_reserve_full_isl,
            reserved_blocks=reserved_blocks,
            has_scheduled_reqs=bool(s.running),
        )
        if new_blocks is None:
            break  # head-of-line: nothing behind it is tried

        request_id = request.request_id
        if connector is not None:
            connector.update_state_after_alloc(request, kvm.get_blocks(request_id), num_external_computed_tokens)
        if did_prefix_cache_lookup:
            # At admission, so lookups that did not get scheduled are not counted.
            kvm.record_prefix_cache_stats(request, num_new_local_computed_tokens)

        if load_kv_async:
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            request.num_computed_tokens = num_computed_tokens
            s._inflight_prefills.add(request)
            skip_request(queue)
            continue

        request = queue.pop_request()
        s.deferred_waiting.discard(request)
        s.running.append(request)
        if request.status == RequestStatus.WAITING:
            scheduled_new_reqs.append(request)
        elif request.status == RequestStatus.PREEMPTED:
            scheduled_resumed_reqs.append(request)
        else:
            raise RuntimeError(f"Invalid request status: {request.status}")
        req_to_new_blocks[request_id] = kvm.get_blocks(request_id)
        num_scheduled_tokens[request_id] = num_new_tokens
        token_budget -= num_new_tokens
        input_budget -= num_new_tokens
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_computed_tokens
        if num_computed_tokens + num_new_tokens < request.num_tokens:
            s._inflight_prefills.add(request)

    if skipped_kv_holding:
        s.kv_holding_waiting.prepend_requests(skipped_kv_holding)
    if skipped_waiting:
        s.waiting.prepend_requests(skipped_waiting)
    if not defer_prefills:
        _, num_waiting = s.get_request_counts()
        s.prefill_capacity_bound = num_waiting > len(s.deferred_waiting)
    return token_budget


def _handle_blocked_waiting_request(s: SchedulerState, request: Request) -> bool:
    """False = skip it this step; promotes a completed async KV load."""
    if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
        if request.request_id not in s.finished_recving_kv_req_ids:
            return False
        _update_waiting_for_remote_kv(s, request)
        request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
    return True


def _update_waiting_for_remote_kv(s: SchedulerState, request: Request) -> None:
    if request.request_id in s.failed_recving_kv_req_ids:
        if request.num_computed_tokens:
            # Cache what is valid (a local hit before the failed load).
            s.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        else:
            s.kv_cache_manager.free(request)
        s.failed_recving_kv_req_ids.remove(request.request_id)
    else:
        # The loaded blocks hold their KV now: cache them.
        s.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
    if request.num_computed_tokens == request.num_tokens:
        # Recompute the last prompt token to sample the first output.
        request.num_computed_tokens = request.num_tokens - 1
    s.finished_recving_kv_req_ids.remove(request.request_id)


def _inflight_prefill_reserved_blocks(s: SchedulerState) -> int:
    kvm = s.kv_cache_manager
    return sum(kvm.get_num_blocks_to_allocate(r, min(r.num_tokens, s.max_model_len)) for r in s._inflight_prefills)
