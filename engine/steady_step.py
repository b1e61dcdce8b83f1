"""One step of steady decode next to the scheduler's waiting pass (issue
15; docs/fast-paths.md).

When requests wait while the running ones are in steady decode
(engine/steady_decode.py), the node takes one step the usual way —
scheduled, executed, completed — but with the running requests' work in
bulk: `schedule_with_steady` does the running pass for all of them at once
and then runs the scheduler's own waiting pass; the model runner and
`update_from_output` (through `update_steady`) apply the rest; the step's
one-token outputs travel as one `SteadyTokens`. A request reaching its
length cap in the step stops and is freed there, as on the plain path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .outputs import EngineCoreOutput, SchedulerOutput, SteadyTokens
from .request import Request, RequestStatus
from .scheduler import Scheduler
from .scheduler_state import SchedulerState
from .steady_caching import SteadyCaching
from .steady_decode import SteadyBatch, finish_at_cap
from .step_output import output_after_bulk_running, seal

if TYPE_CHECKING:
    from .node_core import NodeCore


@dataclass
class SteadyPart:
    """The steady requests of a step scheduled by `schedule_with_steady`."""

    batch: SteadyBatch
    new_blocks: list[tuple[Request, int]]  # (request, the block it took in this step), in running order
    token_at: Callable[[str, int], int]
    finishing: list[Request]  # the requests the step finishes (by their length cap), in running order
    epoch: int  # the scheduler's steady epoch when the step was scheduled

    def update(
        self, s: SchedulerState, stopped_running: set[Request], stopped_preempted: set[Request], failed: set[str]
    ) -> list[EngineCoreOutput | SteadyTokens]:
        """`update_from_output` for these requests (`update_steady`; none of
        them can be preempted or have a failed KV load: both are plain steps)."""
        return update_steady(s, self, stopped_running)


def schedule_with_steady(core: NodeCore, batch: SteadyBatch, per_step: list[list[Request]]) -> SchedulerOutput:
    """`Scheduler.schedule()` for a step whose running requests are all in
    steady decode (one token each, no allocation can fail: `block_plan` for
    one step fits), with waiting requests: the running pass in bulk, then the
    real waiting pass. The output carries the steady requests as a
    `SteadyPart` (`SchedulerOutput.steady`) instead of per-request entries;
    `total_num_scheduled_tokens` counts them. The model runner and
    `update_from_output` apply the rest."""
    s = core.scheduler
    assert isinstance(s, Scheduler)  # the steady paths are v1's
    kvm = s.kv_cache_manager
    pool = kvm.block_pool
    s.current_step += 1
    kvm.new_step_starts()
    num_running, num_waiting = s.get_request_counts()
    long_prefill_threshold = s.scheduler_config.long_prefill_token_threshold if num_running + num_waiting > 1 else 0
    reqs = batch.requests
    b = len(reqs)
    # The running pass: one token each, blocks taken in running order (one
    # call for all: the free queue hands them out front first either way).
    new_blocks: list[tuple[Request, int]] = []
    req_to_blocks = kvm.req_to_blocks
    for r, block in zip(per_step[1], pool.get_new_blocks(len(per_step[1]))):
        req_to_blocks[r.request_id].append(block)
        new_blocks.append((r, block.block_id))
    kvm.num_allocate_slots_calls += b
    if kvm.enable_caching:
        # The blocks their tokens complete in this step are cached before
        # the waiting pass looks up its hits (`allocate_slots` order).
        SteadyCaching(kvm, core.sampler, batch.cohort, s.current_step - 1, [[], []], 1).step(1)
    so = output_after_bulk_running(s, b, long_prefill_threshold)
    # `update_after_schedule` for the steady requests: their counters are
    # written lazily (`SteadyCohort.settle`).
    so.steady = SteadyPart(batch, new_blocks, core.sampler.token_at, batch.finishing(1), s.steady_epoch)
    cohort = batch.cohort
    cohort.owed = cohort.in_flight = True
    if cohort.shadow_lag is not None:
        cohort.shadow_lag.in_flight = True  # its decode runs when it ends (the runner's `finish_step`)
    seal(s, so)  # the step has tokens (`total` counts the steady ones): it takes the fence's next number
    return so


def update_steady(
    s: SchedulerState, part: SteadyPart, stopped_running: set[Request]
) -> list[EngineCoreOutput | SteadyTokens]:
    """`update_from_output` for the steady requests of a step, in running
    order: one token each; a request reaching its length cap in this step
    gets its sampled token, stops and is freed there, as on the plain path
    (`stopped_running` collects it, for the caller to drop from `running`).
    Returns the `SteadyTokens` of the others,
    then the finishing ones' outputs."""
    if part.finishing or part.epoch != s.steady_epoch:
        return _update_with_finishes(s, part, stopped_running)
    cohort = part.batch.cohort
    cohort.in_flight = False
    cohort.owed = True  # their token each, written lazily (`SteadyCohort.settle`)
    return [SteadyTokens(part.batch.ids)]


def _update_with_finishes(
    s: SchedulerState, part: SteadyPart, stopped_running: set[Request]
) -> list[EngineCoreOutput | SteadyTokens]:
    """`update_steady` when a request finishes in the step, or one was
    finished from outside while the step was in flight (an abort applied
    before this update, `EngineCore.process_oldest`): as on the plain path,
    that one gets nothing, and a step with no output for anyone emits
    nothing."""
    cohort = part.batch.cohort
    ending = set(part.finishing)
    if part.epoch == s.steady_epoch:
        # Nobody was finished from outside: every member but the finishing
        # ones gets its token (`part.finishing` is in running order).
        stopping = part.finishing
        ids = [r.request_id for r in part.batch.requests if r not in ending]
    else:
        stopping, ids = [], []
        requests = s.requests
        for r in part.batch.requests:
            if r.status > RequestStatus.PREEMPTED:
                # Finished from outside (it left the running list: the cohort is
                # built again); `finish_requests` settled its counters first.
                if requests.get(r.request_id) is r:
                    r.num_in_flight_tokens -= 1
            elif r in ending:
                stopping.append(r)
            else:
                ids.append(r.request_id)
    finished: list[EngineCoreOutput | SteadyTokens] = []
    for r in stopping:
        cohort.settle_one(s, r)  # as scheduled: its token in flight
        r.num_in_flight_tokens -= 1
        finished.append(finish_at_cap(s, r, 1, part.token_at, stopped_running))
    cohort.in_flight = False
    cohort.owed = True  # the others' tokens, written lazily (`SteadyCohort.settle`)
    if not ids and not finished:
        return []
    return [SteadyTokens(ids), *finished]
