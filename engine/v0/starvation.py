"""Counters for the three starvation paths of the v0 FCFS scheduler, and the
diagnosis computed from them.

Every counter records events the scheduler actually went through; the probes
are read-only (they never change queues, blocks or the budget). Definitions:

head-of-line (HOL) — `_schedule_prefills` stopped (`break`) at a waiting head
  H that could not be admitted (allocation LATER, or the token / sequence budget
  could not take it) while requests BEHIND H could have been admitted in the
  same step. "Could have been admitted": a scan of the queue behind H that skips
  every request that does not fit (instead of stopping), admitting greedily
  against the step's remaining budget and the free GPU blocks above the
  watermark, with the scheduler's own rules (prompt limit, AllocStatus, chunking
  to the remaining budget). `head_of_line_events` counts such steps, `head_of_line_bypassable` the
  requests that scan admits (request-steps).

preempt-reinsert — each group preempted by RECOMPUTE goes back to the head of
  `waiting` (`extendleft`). `recompute_reinsertions` counts them;
  `recompute_overtaken` adds the number of requests left in `waiting` at that
  moment (all now behind the victim); `recompute_overtaken_earlier_arrivals`
  only those that arrived before the victim (strict FCFS inversions).

swap-priority — a default (non-chunked) step skipped the prefill phase because
  `swapped` was non-empty while `waiting` was not. `swap_priority_events` counts
  such steps, `swap_priority_waiting` the waiting requests in them
  (request-steps), `swap_priority_bypassable` those vLLM's own prefill pass
  (FCFS, stopping at the first misfit) would have admitted had `swapped` been
  empty. With chunked prefill, prefills always run: no events.

Both probes scan at most `PROBE_SCAN_LIMIT` waiting requests, so a huge
backlog costs a bounded amount per step.

The diagnosis compares request-steps held back: `head_of_line_bypassable`,
`recompute_overtaken` and `swap_priority_bypassable`; the largest names the
dominant path (ties in that order).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from engine.v0.sequence import SequenceGroup, SequenceStatus

if TYPE_CHECKING:
    from engine.v0.block_manager import BlockSpaceManagerV1
    from engine.v0.scheduler_outputs import SchedulingBudget

# How deep a probe scans the waiting queue per step.
PROBE_SCAN_LIMIT = 512

HEAD_OF_LINE = "head-of-line"
PREEMPT_REINSERT = "preempt-reinsert"
SWAP_PRIORITY = "swap-priority"
NO_STARVATION = "none"


@dataclass
class StarvationCounters:
    head_of_line_events: int = 0
    head_of_line_bypassable: int = 0
    # Why the head stopped the pass, per event.
    head_of_line_alloc_later: int = 0
    head_of_line_budget: int = 0
    # request id of a blocking head -> events it caused.
    head_of_line_blockers: dict[str, int] = field(default_factory=dict)
    recompute_reinsertions: int = 0
    recompute_overtaken: int = 0
    recompute_overtaken_earlier_arrivals: int = 0
    swap_priority_events: int = 0
    swap_priority_waiting: int = 0
    swap_priority_bypassable: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _admissible(
    bm: BlockSpaceManagerV1,
    prompt_limit: int,
    groups: Iterable[SequenceGroup],
    budget: SchedulingBudget,
    enable_chunking: bool,
    stop_at_first_misfit: bool,
) -> int:
    """How many of `groups` a prefill pass would admit now, without admitting
    them (`prompt_limit`: the scheduler's, rule 3)."""
    free = bm.get_num_free_gpu_blocks()
    total, watermark = bm.num_total_gpu_blocks, bm.watermark_blocks
    token_budget, max_seqs = budget.token_budget, budget.max_num_seqs
    tokens, seqs = budget.num_batched_tokens, budget.num_curr_seqs
    admitted = 0
    for g in islice(groups, PROBE_SCAN_LIMIT):
        if tokens >= token_budget or seqs >= max_seqs or free - 1 < watermark:
            break  # nothing else can fit: every request needs a token, a sequence slot and a block
        seq = g.seq
        if seq.status != SequenceStatus.WAITING:
            continue
        new_tokens = seq.get_num_new_tokens()
        if enable_chunking:
            new_tokens = min(new_tokens, token_budget - tokens)
        required = seq.n_blocks
        ignored = new_tokens > prompt_limit or total - required < watermark  # dropped, never blocks
        if not ignored and free - required >= watermark and tokens + new_tokens <= token_budget:
            admitted += 1
            free -= required
            tokens += new_tokens
            seqs += 1
        elif stop_at_first_misfit and not ignored:
            break  # vLLM's own pass stops here
    return admitted


def probe_head_of_line(
    c: StarvationCounters,
    bm: BlockSpaceManagerV1,
    prompt_limit: int,
    head: SequenceGroup,
    behind: Iterable[SequenceGroup],
    budget: SchedulingBudget,
    enable_chunking: bool,
    alloc_later: bool,
) -> None:
    n = _admissible(bm, prompt_limit, behind, budget, enable_chunking, stop_at_first_misfit=False)
    if n == 0:
        return
    c.head_of_line_events += 1
    c.head_of_line_bypassable += n
    if alloc_later:
        c.head_of_line_alloc_later += 1
    else:
        c.head_of_line_budget += 1
    c.head_of_line_blockers[head.request_id] = c.head_of_line_blockers.get(head.request_id, 0) + 1


def probe_swap_priority(
    c: StarvationCounters,
    bm: BlockSpaceManagerV1,
    prompt_limit: int,
    waiting: Collection[SequenceGroup],
    budget: SchedulingBudget,
) -> None:
    c.swap_priority_events += 1
    c.swap_priority_waiting += len(waiting)
    c.swap_priority_bypassable += _admissible(
        bm, prompt_limit, waiting, budget, enable_chunking=False, stop_at_first_misfit=True
    )


def record_reinsertions(
    c: StarvationCounters, victims: list[SequenceGroup], remaining_waiting: Iterable[SequenceGroup]
) -> None:
    if not victims:
        return
    waiting = list(remaining_waiting)
    for v in victims:
        c.recompute_reinsertions += 1
        c.recompute_overtaken += len(waiting)
        c.recompute_overtaken_earlier_arrivals += sum(1 for g in waiting if g.arrival_time < v.arrival_time)


def diagnose(counters: StarvationCounters | dict[str, Any]) -> tuple[str, str]:
    """(dominant path, explanation) from the counters alone. The path is one of
    "head-of-line", "preempt-reinsert", "swap-priority" or "none"."""
    c = counters if isinstance(counters, StarvationCounters) else StarvationCounters(**counters)
    scores = {
        HEAD_OF_LINE: c.head_of_line_bypassable,
        PREEMPT_REINSERT: c.recompute_overtaken,
        SWAP_PRIORITY: c.swap_priority_bypassable,
    }
    detail = (
        f"head-of-line: {c.head_of_line_events} steps stopped at a blocked head while "
        f"{c.head_of_line_bypassable} request-steps behind it could have been admitted "
        f"({c.head_of_line_alloc_later} by KV allocation, {c.head_of_line_budget} by token/seq budget); "
        f"preempt-reinsert: {c.recompute_reinsertions} recomputed victims put back at the head of waiting, "
        f"overtaking {c.recompute_overtaken} waiting requests "
        f"({c.recompute_overtaken_earlier_arrivals} of them earlier arrivals); "
        f"swap-priority: {c.swap_priority_events} steps skipped prefill while swapped was non-empty "
        f"({c.swap_priority_waiting} waiting request-steps, {c.swap_priority_bypassable} admissible)"
    )
    total = sum(scores.values())
    if total == 0:
        return NO_STARVATION, "no starvation-path events. " + detail
    dominant = max(scores, key=lambda k: scores[k])  # first maximum wins: dict order breaks ties
    share = 100.0 * scores[dominant] / total
    blockers = ""
    if dominant == HEAD_OF_LINE and c.head_of_line_blockers:
        top = max(c.head_of_line_blockers.items(), key=lambda kv: kv[1])
        blockers = f" The worst blocking head was request {top[0]!r} ({top[1]} steps)."
    return dominant, (
        f"{dominant} dominates with {scores[dominant]} of {total} held-back request-steps "
        f"({share:.1f}%).{blockers} " + detail
    )
