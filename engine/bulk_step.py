"""One step whose running requests all decode one token, with their share of
the step done in bulk (issue 15; docs/fast-paths.md).

A node with async scheduling or pipeline stages keeps several steps in
flight, so its steps are never steady in engine/steady_decode.py's sense
(which reads a request's counters lazily between steps) and it steps one by
one. Most of those steps still only decode: every running request gets one
token. `schedule_bulk` schedules such a step with the plain path's own
running pass — the same async guard, the same allocation calls (or the same
counted skips), in running order, then the real waiting pass — but keeps
the running requests out of the per-request fields of the `SchedulerOutput`
(`num_scheduled_tokens`, the cached-request data) and out of the model
runner's entries: they travel as one `BulkPart` (`SchedulerOutput.steady`).
Every counter is written as the plain path writes it, when it writes it
(here, unlike the steady cohort, nothing is lazy), so a plain step may come
before, after or between such steps, with any number in flight; the step's
update (`BulkPart.update`) is the plain update's one-token case, request by
request, and its tokens go to the proxy as one `SteadyTokens`.

Only while an in-process batch run takes the fast paths
(`Scheduler.bulk_token_outputs`, set by cluster/inproc/cluster.py): the
proxy there reads `SteadyTokens`. Whenever anything else is asked of the
running pass — a prefill chunk, a preemption, a token budget smaller than
the batch, speculative tokens, a wrapped allocator — `schedule_bulk`
returns None before changing anything and the plain `schedule()` runs.
"""

from __future__ import annotations

from .free_path import free_request
from .kv_cache_manager import KVCacheBlocks
from .outputs import EngineCoreOutput, SchedulerOutput, SteadyTokens
from .request import Request, RequestStatus
from .sampler import DeterministicSampler
from .scheduler_state import SchedulerState
from .step_output import output_after_bulk_running, seal, step_begins
from .stop_checker import check_stop


class BulkPart:
    """The running requests of a step scheduled by `schedule_bulk`: each
    decodes (or, its prompt's last token, prefills) one token."""

    __slots__ = ("members", "starts", "new_blocks", "shape_terms", "sampler")

    def __init__(
        self,
        members: list[Request],
        starts: list[int],
        new_blocks: list[tuple[Request, int]],
        shape_terms: tuple[int, int, int, int, int],
        sampler: DeterministicSampler,
    ) -> None:
        self.members = members  # in running order
        self.starts = starts  # each one's computed tokens before the step
        self.new_blocks = new_blocks  # (request, a block it took), in running order
        # (prefill tokens, decode tokens, context, decode context, prefill attention pairs)
        self.shape_terms = shape_terms
        self.sampler = sampler

    def update(
        self, s: SchedulerState, stopped_running: set[Request], stopped_preempted: set[Request], failed: set[str]
    ) -> list[EngineCoreOutput | SteadyTokens]:
        """`update_from_output` for these requests, in running order: what its
        per-request loop does with one sampled token each (the token drawn
        here: the runner samples `token_at(request, start + 1)` on the plain
        path). Returns their `SteadyTokens`, then the outputs of those that
        stopped.

        In two passes: the in-flight and stale counters of every member,
        which decide who takes a token; then the tokens, drawn together
        (`DeterministicSampler.tokens_each`), and the rest, member by member.
        What the second pass does to one request (a finish frees its blocks)
        decides nothing in the first pass for another."""
        s.settle_steady()  # (no-op unless a synchronous node's cohort is owed)
        requests = s.requests
        max_model_len = s.max_model_len
        kvm = s.kv_cache_manager
        caching = kvm.enable_caching
        num_cached_block = kvm.num_cached_block
        block_size = s.block_size
        ids: list[str] = []
        finished: list[EngineCoreOutput | SteadyTokens] = []
        running = RequestStatus.RUNNING
        taking: list[Request] = []
        stale: list[bool] = []
        positions: list[int] = []
        for member, start in zip(self.members, self.starts):
            req_id = member.request_id
            request = requests.get(req_id)
            output_is_stale = False
            if request is not None:
                request.num_in_flight_tokens -= 1
                if request.num_stale_output_tokens > 0:
                    output_is_stale = True
                    request.num_stale_output_tokens -= 1
            if req_id in failed:
                continue
            if request is None or request.status > RequestStatus.PREEMPTED:
                continue
            if output_is_stale and request.drop_stale_output:
                continue
            taking.append(request)
            stale.append(output_is_stale)
            positions.append(start + 1)
        tokens = self.sampler.tokens_each([r.request_id for r in taking], positions)
        for request, output_is_stale, token in zip(taking, stale, tokens):
            req_id = request.request_id
            status_before_stop = request.status
            had_placeholders = request.num_output_placeholders > 0
            outputs = request._output_token_ids
            outputs.append(token)
            request.num_tokens += 1
            params = request.sampling_params
            # `check_stop` only when it could stop the request (it decides
            # how): an EOS, stop tokens, `min_tokens` not reached, a length cap.
            stopped = (
                token == request.eos_token_id
                or bool(params.stop_token_ids)
                or len(outputs) < params.min_tokens
                or request.num_tokens >= max_model_len
                or len(outputs) >= request.max_tokens
            ) and check_stop(request, max_model_len)
            if not output_is_stale and had_placeholders:
                request.num_output_placeholders -= 1
            if caching and had_placeholders and not output_is_stale and status_before_stop == running:
                upto = request.num_computed_tokens - request.num_in_flight_tokens
                full = upto if upto < request.num_tokens else request.num_tokens  # (min, without the call)
                if full // block_size > num_cached_block.get(req_id, 0):
                    kvm.cache_blocks(request, upto)
            if not stopped:
                ids.append(req_id)
                continue
            finish_reason = request.get_finished_reason()
            kv_transfer_params = free_request(s, request)
            if status_before_stop == running:
                stopped_running.add(request)
            else:
                stopped_preempted.add(request)
            finished.append(
                EngineCoreOutput(
                    req_id, [token], finish_reason, request.stop_reason, kv_transfer_params,
                    num_preemptions=request.num_preemptions,
                )
            )  # fmt: skip
        if ids:
            return [SteadyTokens(ids), *finished]
        return finished


def schedule_bulk(s: SchedulerState, sampler: DeterministicSampler) -> SchedulerOutput | None:
    """`Scheduler.schedule()` for a step whose scheduled running requests all
    get one token and whose allocations all fit (the module docstring), or
    None — having changed nothing — when the plain pass is needed."""
    s.settle_steady()  # a synchronous node's steady cohort may owe counters read below
    running = s.running
    kvm = s.kv_cache_manager
    if not running or s.num_lookahead_tokens or "allocate_slots" in getattr(kvm, "__dict__", ()):
        return None
    max_model_len = s.max_model_len
    block_size = s.block_size
    req_to_blocks = kvm.req_to_blocks
    free = kvm.block_pool.get_num_free_blocks()
    members: list[Request] = []
    starts: list[int] = []
    # The step's shape terms, as the model runner adds them up per entry.
    prefill = decode = context = decode_context = pairs = 0
    # The running pass's decisions first, changing nothing: who is scheduled,
    # and whether every allocation fits (each takes at most what it lacks).
    for request in running:
        placeholders = request.num_output_placeholders
        computed = request.num_computed_tokens
        # The async guard: the step in flight already yields the last token.
        if placeholders > 0 and computed + 2 - placeholders >= request.num_prompt_tokens + request.max_tokens:
            continue
        if request.spec_token_ids:
            return None
        num_new_tokens = request.num_tokens + placeholders - computed
        if num_new_tokens != 1:
            if num_new_tokens <= 0:
                continue  # its output is still in flight (pipeline stages): skipped, as on the plain path
            return None
        if computed + 2 > max_model_len:
            continue  # no token fits under max_model_len: skipped, as on the plain path
        blocks = req_to_blocks.get(request.request_id)
        lacking = -(-(computed + 1) // block_size) - (len(blocks) if blocks is not None else 0)
        if lacking > 0:
            free -= lacking
            if free < 0:
                return None  # an allocation would fail: preemption is the plain path's
        members.append(request)
        starts.append(computed)
        if computed < request.num_prompt_tokens:
            prefill += 1
            pairs += computed + 1
        else:
            decode += 1
            decode_context += computed + 1
        context += computed + 1
    b = len(members)
    if b == 0 or b > s.max_num_scheduled_tokens or b > s.scheduler_config.max_num_batched_tokens:
        return None  # nobody to decode, or the budget would end the running pass early

    step_begins(s)
    num_running, num_waiting = s.get_request_counts()
    long_prefill_threshold = s.scheduler_config.long_prefill_token_threshold if num_running + num_waiting > 1 else 0
    # The allocations, in running order: the plain pass's counted skip when
    # the last block has room and no block is to be cached, else the call.
    allocate_slots = kvm.allocate_slots
    num_cached_block = kvm.num_cached_block if kvm.enable_caching else None
    new_blocks: list[tuple[Request, int]] = []
    skipped_calls = 0
    for request, computed in zip(members, starts):
        rid = request.request_id
        have = req_to_blocks.get(rid)
        if have is not None and computed + 1 <= len(have) * block_size:
            if num_cached_block is None:
                skipped_calls += 1
                continue
            full = computed + 1 if computed + 1 < request.num_tokens else request.num_tokens  # (min, without the call)
            if full // block_size <= num_cached_block.get(rid, 0):
                skipped_calls += 1
                continue
        got: KVCacheBlocks | None = allocate_slots(request, 1, num_lookahead_tokens=0)
        assert got is not None, f"{rid}: an allocation counted as fitting failed"
        if got.blocks:
            for block in got.blocks:
                new_blocks.append((request, block.block_id))
    kvm.num_allocate_slots_calls += skipped_calls

    so = output_after_bulk_running(s, b, long_prefill_threshold)
    so.steady = BulkPart(members, starts, new_blocks, (prefill, decode, context, decode_context, pairs), sampler)
    seal(s, so)  # the step has tokens: it takes the fence's next number
    # `update_after_schedule` for the members (one token each: never a
    # partial prefill; with async scheduling, a placeholder each).
    seq = s.sched_step_seq if s.defer_block_free else None
    inflight_prefills = s._inflight_prefills
    adds_placeholders = s.adds_output_placeholders
    for request in members:
        request.num_computed_tokens += 1
        request.num_in_flight_tokens += 1
        if seq is not None:
            request.last_sched_seq = seq
        request.is_prefill_chunk = False
        if inflight_prefills:
            inflight_prefills.discard(request)
        if adds_placeholders:
            request.num_output_placeholders += 1
    return so
