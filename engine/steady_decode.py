"""Steady decode, computed in bulk (issue 15; docs/fast-paths.md).

Between two events that can change a schedule — an arrival, a KV load, an
allocation that could fail, a preemption, a fence drain — a synchronous v1
node only decodes: every running request gets one token per step, in the
same order, and nothing else changes but token counts, the blocks requests
grow into, and requests reaching their length cap. `SteadyBatch`
recognises that state and `advance` applies `m` such steps in one go, with
what `schedule()`, the model runner and `update_from_output()` would have
left behind step by step: token counts, block ids handed out in the same
order (step by step, requests in running order, a finished request's blocks
back before the next step's), allocator-call counts, step numbers, fence
sequence numbers, the runner's block tables, shadow KV reads and writes, the
blocks entered into the prefix cache (engine/steady_caching.py), the
finishing requests' outputs and frees, and one `StepRecord` per step.
engine/steady_step.py does the same for one step next to the scheduler's
real waiting pass. What is fixed about the running requests between events
(their finish steps, the steps they take blocks at) is kept from step to
step in the node's cohort (engine/steady_cohort.py), so reading the batch
costs what joined or left it, not a pass over it.

What is not covered returns None from `steady_batch` and the node steps as
usual: async scheduling or a batch queue deeper than one, v0, prefill
chunks, requests that could stop on a sampled token (EOS
the sampler can produce, stop token ids), pending KV connector output, a
shadow store that already saw trouble for a request. The runtime
(cluster/inproc/fast_forward.py) decides how many of the possible steps fit
before the next event and supplies their times.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .free_path import free_request
from .outputs import EngineCoreOutput
from .records import StepRecord
from .request import Request
from .scheduler import Scheduler
from .scheduler_state import SchedulerState
from .steady_batch import SteadyBatch as SteadyBatch  # (re-exported: the in-process fast-forward reads it here)
from .steady_caching import SteadyCaching
from .steady_cohort import sync
from .steady_shadow import ShadowLag
from .stop_checker import check_stop

if TYPE_CHECKING:
    from .kv_cache_block import KVCacheBlock
    from .node_core import NodeCore


def is_quiet(core: NodeCore) -> bool:
    """Nothing but the running requests to schedule: no waiting request, no
    KV load to finish, no worker output. (With waiting requests,
    `schedule_with_steady` steps.) Requests finished or preempted since the
    last step need no step of their own: a forward's first step names them
    to the runner as a plain step's output would (`advance`), and the KV
    connector's metadata does not read them (`PDConnector.build_connector_meta`)."""
    s = core.scheduler
    assert isinstance(s, Scheduler)  # the steady paths are v1's
    return not (
        s.waiting
        or s.kv_holding_waiting
        or s.deferred_waiting
        or s.finished_recving_kv_req_ids
        or s.failed_recving_kv_req_ids
        or core.has_worker_output()
    )


def steady_batch(core: NodeCore, admitting: bool = False) -> SteadyBatch | None:
    """The running batch if the node is in steady decode, else None.
    `admitting`: for a step that also runs the waiting pass (`schedule_with_steady`):
    waiting requests, KV loads and worker output are then allowed (else see `is_quiet`)."""
    if core.is_v0 or type(core.scheduler) is not Scheduler:
        return None  # v0, or async scheduling (placeholders)
    engine = core.engine
    if engine.depth != 1 or engine.batch_queue or engine.pending_aborts:
        return None
    s = core.scheduler
    assert isinstance(s, Scheduler)  # the steady paths are v1's
    if s.deferred_frees or s.num_lookahead_tokens:
        return None
    if not admitting and not is_quiet(core):
        return None
    connector = s.connector
    if connector is not None and (not connector.is_idle() or connector.has_pending_push_work()):
        return None
    b = len(s.running)
    if b == 0 or b > s.max_num_scheduled_tokens or b > s.scheduler_config.max_num_batched_tokens:
        return None
    synced = sync(s, core.sampler)
    if synced is None:
        return None
    cohort, members = synced
    if core.shadow is not None:
        if cohort.shadow_lag is None:
            cohort.shadow_lag = ShadowLag(core.shadow, core.runner.requests)
        bad = core.shadow._bad
        if bad and not bad.keys().isdisjoint(cohort.ids):
            return None  # the shadow store saw trouble for a request: step by step
    base = s.current_step
    return SteadyBatch(members, list(cohort.ids), base, cohort.computed_offset + b * base, cohort)


def block_plan(core: NodeCore, batch: SteadyBatch, m: int) -> tuple[list[list[Request]], list[list[Request]], int]:
    """For steps 1..m: which requests take a new block in each step (in
    running order), which ones finish in it (their blocks return after the
    step's allocations), and how many steps fit before the free blocks run
    out."""
    s = core.scheduler
    assert isinstance(s, Scheduler)  # the steady paths are v1's
    kvm = s.kv_cache_manager
    cohort, base = batch.cohort, batch.base
    req_to_blocks = kvm.req_to_blocks
    per_step: list[list[Request]] = [[]]
    finishing: list[list[Request]] = [[]]
    free = kvm.block_pool.get_num_free_blocks()
    # With prefix caching a block may be shared (a cache hit): a finishing
    # request's shared blocks stay taken. Counting them as staying even when
    # the other holder finishes too only ends a forward early. (While no
    # block is shared, all come back: no pass over them.)
    shared = kvm.enable_caching and kvm.block_pool.num_shared > 0
    fits = m
    ended: set[Request] = set()  # finished at an earlier step
    for j in range(1, m + 1):
        step = base + j
        takers = cohort.takers(step, ended)
        gone = batch.finishing(j)
        if gone:
            ended.update(gone)
        per_step.append(takers)
        finishing.append(gone)
        free -= len(takers)
        if free < 0:
            fits = j - 1
            break
        for r in gone:
            blocks = req_to_blocks[r.request_id]
            held = [b.ref_cnt for b in blocks].count(1) if shared else len(blocks)
            free += held + cohort.blocks_taken(r, base, step)
    return per_step, finishing, fits


def finish_at_cap(
    s: SchedulerState, r: Request, k: int, token_at: Callable[[str, int], int], stopped: set[Request]
) -> EngineCoreOutput:
    """`update_from_output` for a steady request's next `k` tokens, the
    last of which reaches its length cap: the others stay unsampled (drawn
    when read), the last is sampled, the request stops, is freed and leaves
    the steady cohort, and its output carries that token. (`stopped`
    collects it, for the caller to drop from `running`.)"""
    r.append_unsampled(k - 1, token_at)
    token = token_at(r.request_id, r.num_tokens)
    r.append_output_token_ids(token)
    assert check_stop(r, s.max_model_len), f"{r.request_id} was expected to finish after {k} more tokens"
    kv_transfer_params = free_request(s, r)
    stopped.add(r)
    s.steady_cohort.leave(r)  # type: ignore[union-attr]  # a steady request is a member
    return EngineCoreOutput(
        r.request_id, [token], r.get_finished_reason(), r.stop_reason, kv_transfer_params,
        num_preemptions=r.num_preemptions,
    )  # fmt: skip


def advance(
    core: NodeCore,
    batch: SteadyBatch,
    per_step: list[list[Request]],
    finishing: list[list[Request]],
    m: int,
    times: list[float],
    durations: list[float],
    sizes: list[int],
    contexts: list[int],
) -> dict[int, list[EngineCoreOutput]]:
    """Apply steps 1..m; `times[j]` is when step j+1 is scheduled (times[0]
    now, times[j] the end of step j), `durations[j-1]` step j's modelled
    time, `sizes[j-1]` and `contexts[j-1]` its batch and attended context
    (`SteadyBatch.shapes`). The steps' records go to the engine (and its observer), as each
    step's would. Returns the outputs of the requests each step finished (by
    their length cap), as `update_from_output` makes them; every other output
    of these steps is one token per request and step."""
    s = core.scheduler
    assert isinstance(s, Scheduler)  # the steady paths are v1's
    kvm = s.kv_cache_manager
    pool = kvm.block_pool
    runner = core.runner
    shadow = core.shadow
    engine = core.engine
    reqs = batch.requests
    states = runner.requests
    # The first step's output names the requests finished since the last one:
    # the runner forgets them then.
    if s.finished_req_ids:
        for rid in s.finished_req_ids:
            runner.forget(rid)
            runner.retire(rid)  # no step is in flight
        s.finished_req_ids = set()
    if s.reset_preempted_req_ids:
        s.reset_preempted_req_ids = set()

    token_at = core.sampler.token_at
    # With prefix caching a step caches the blocks its tokens complete (as
    # `allocate_slots` does), before the step's frees put them back.
    caching = SteadyCaching(kvm, core.sampler, batch.cohort, batch.base, finishing, m) if kvm.enable_caching else None
    defer = s.defer_block_free
    seq0 = s.sched_step_seq
    cohort = batch.cohort
    base = batch.base
    lag = cohort.shadow_lag  # the members' shadow decodes: owed, issued when settled (engine/steady_shadow.py)
    if lag is not None:
        lag.steps_done(base + 1, times[1 : m + 1])

    # Step by step: blocks in the order step-by-step allocation takes them,
    # then the frees of the requests the step finished.
    free_after: list[int] = []
    req_to_blocks = kvm.req_to_blocks
    outputs: dict[int, list[EngineCoreOutput]] = {}
    stopped: set[Request] = set()
    # Blocks are taken from the front of the free queue and frees put blocks
    # back at the front, so the blocks of the steps up to the next free are
    # taken in one call, in the same order.
    want_from = [0] * (m + 2)  # blocks from step j up to the next step with frees (inclusive)
    for k in range(m, 0, -1):
        want_from[k] = len(per_step[k]) + (0 if finishing[k] else want_from[k + 1])
    taken: list[KVCacheBlock] = []
    free = pool.get_num_free_blocks()
    # The shadow store hears of new owners once per run of steps up to a
    # finish: between two finishes nothing else reaches it.
    assigned: list[tuple[int, str]] = []
    absent = 0  # (request, step) pairs of requests finished before the step
    for j in range(1, m + 1):
        if j == 1 or finishing[j - 1]:
            assert not taken
            taken = pool.get_new_blocks(want_from[j])
            taken.reverse()  # pop() from the end = the front of the queue first
        for r in per_step[j]:
            rid = r.request_id
            block = taken.pop()
            req_to_blocks[rid].append(block)
            states[rid].block_ids.append(block.block_id)
            if shadow is not None:
                assigned.append((block.block_id, rid))
        free -= len(per_step[j])
        free_after.append(free)
        if caching is not None and caching.steps[j]:
            caching.step(j)
        if finishing[j]:
            absent += (m - j) * len(finishing[j])  # the steps after this one
            if assigned:
                shadow.assign_each(assigned)  # type: ignore[union-attr]  # only filled with a store
                assigned = []
            if defer:
                s.sched_step_seq = s.processed_step_seq = seq0 + j
            step_outputs = outputs[j] = []
            for r in finishing[j]:
                # Its counters before step 1 (the scheduler's step is still
                # `base`) and its shadow decodes up to this step.
                cohort.settle_one(s, r, base + j)
                r.num_computed_tokens += j
                if defer:
                    r.last_sched_seq = seq0 + j
                step_outputs.append(finish_at_cap(s, r, j, token_at, stopped))
            free = pool.get_num_free_blocks()
            if j < m:
                # The next step's output names them: the runner forgets them.
                for r in finishing[j]:
                    rid = r.request_id
                    runner.forget(rid)
                    runner.retire(rid)
                s.finished_req_ids = set()
    if assigned:
        shadow.assign_each(assigned)  # type: ignore[union-attr]
    # One (skipped or real) allocation call per request and step it took part in.
    kvm.num_allocate_slots_calls += m * len(reqs) - absent
    if defer:
        s.sched_step_seq = s.processed_step_seq = seq0 + m

    # Everyone else: m tokens, their counters written lazily (`SteadyCohort.settle`).
    if stopped:
        s.running = [r for r in s.running if r not in stopped]
    cohort.owed = True

    # One record per step, as EngineCore._record and StepLoop._submit fill it.
    first_index = s.current_step + 1
    s.current_step += m
    engine.num_steps += m
    if engine.record_steps:
        total = s.get_num_total_gpu_blocks()
        deferred = s.counters.deferred_free_blocks
        npre, nzero = s.get_preemption_totals()
        name = engine.name
        records: list[StepRecord] = []
        for j in range(m):
            b, ctx = sizes[j], contexts[j]
            records.append(
                StepRecord(
                    name, times[j], first_index + j, b, b, 0, b, b, 0, 0, free_after[j], deferred, total,
                    1, npre, nzero, durations[j], ctx, ctx, 0,
                )
            )  # fmt: skip
        engine.step_records.extend(records)
        if engine.on_step is not None:
            for rec in records:
                engine.on_step(rec)
    return outputs
