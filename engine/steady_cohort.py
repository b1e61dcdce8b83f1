"""The running batch of a node in steady decode, kept from step to step
(issue 15; docs/fast-paths.md).

Reading the whole running batch at every event (an arrival, a forward, an
admission step) cost a pass over every running request each time, though
in steady decode almost nothing about them changes: each one's finish step
and the steps at which it needs a new block are fixed numbers once counted
in absolute steps (`Scheduler.current_step`). The cohort keeps them:

- `by_finish`: absolute step -> the members that reach their length cap in
  it (the step's `finishing`, and the batch's shapes);
- `by_residue`: step mod block size -> the members that take a new block at
  steps of that residue, from their first such step (`Request.steady_due`)
  on: a request decoding one token a step fills a block every `block_size`
  steps;

both in running order (members join in running order and only ever leave).
A request joins after the checks `steady_batch` made of every running request
at every call before: it decodes exactly one token a step, only its length
cap can stop it, nothing is pending for it. Those checks stay true while the
scheduler only takes steady steps: a plain `schedule()` starts a new epoch
(`Scheduler.steady_epoch`) and the cohort is built again; any other change to
the running list (an abort, say) shows as a running list the cohort does not
match, and the cohort is built again too. Requests appended to the running
list by a steady admission step join at the end.

The members' token counters are written lazily. While the scheduler only
takes steady steps, a member's computed tokens at step T are its offset
(`Request.steady_offset`) plus T, its tokens one more (one fewer while a
steady step is in flight), and its output ids that many UNSAMPLED ones past
its prompt; writing them into every member at every step was a pass over the
batch per step. The steady paths leave them as they are, and `settle` writes
them (`Request.steady_written`: the step they were written for) before
anything else reads them: a plain `schedule()`, `finish_requests`, an
`update_from_output` of a plain step, a member's own finish, and building the
cohort again.

`DISAGG_SIM_CHECK_STEADY_COHORT=1` compares the cohort with one built from
scratch at every use, and checks that every member's counters are ones the
steady paths can have left (tests/e2e_inproc/test_fast_paths*.py run with it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .request import Request, RequestStatus

if TYPE_CHECKING:
    from .kv_cache_manager import KVCacheManager
    from .sampler import DeterministicSampler
    from .steady_shadow import ShadowLag

CHECK = os.environ.get("DISAGG_SIM_CHECK_STEADY_COHORT", "0").strip().lower() in ("1", "true", "on", "yes")


class CohortHost(Protocol):
    """What the cohort reads and keeps of the scheduler that holds it
    (engine/scheduler_state.py): declared here, so that the state can hold
    a cohort without the two modules importing each other."""

    max_model_len: int
    kv_cache_manager: KVCacheManager
    running: list[Request]
    current_step: int
    steady_epoch: int
    steady_cohort: SteadyCohort | None
    defer_block_free: bool
    sched_step_seq: int


class SteadyCohort:
    def __init__(self, s: CohortHost, sampler: DeterministicSampler) -> None:
        self.epoch = s.steady_epoch
        self.block_size = s.kv_cache_manager.block_size
        # The running list, in order, and their ids (dicts: a member leaves in O(1)).
        self.members: dict[Request, None] = {}
        self.ids: dict[str, None] = {}
        self.by_finish: dict[int, list[Request]] = {}
        self.by_residue: list[list[Request]] = [[] for _ in range(self.block_size)]
        # Sum over members of (computed tokens - current step): with every
        # member one token further each step, the batch's computed tokens at
        # step T are this plus T times the members.
        self.computed_offset = 0
        # Members that hold a spare block (their first new block is more than
        # a block's worth of steps away): only they make `takers` check the
        # first step. A request holds exactly the blocks its tokens fill.
        self.spare: set[Request] = set()
        self._can_sample: Callable[[int], bool] = sampler.can_sample
        self._eos_checked: int | None = None
        # Lazy counters: whether a steady path left members' counters
        # unwritten, and whether a steady step is in flight (scheduled by
        # `schedule_with_steady`, not yet updated).
        self.owed = False
        self.in_flight = False
        self.token_at: Callable[[str, int], int] = sampler.token_at
        # The members' shadow-KV decodes, issued lazily too (None: no shadow store).
        self.shadow_lag: ShadowLag | None = None

    # ------------------------------------------------------------ membership
    def join(self, s: CohortHost, r: Request) -> bool:
        """Add a running request that is in steady decode; False if it is not
        (it then stays out)."""
        computed = r.num_computed_tokens
        if r.num_tokens != computed + 1:
            return False
        if (
            r.status != RequestStatus.RUNNING
            or r.is_prefill_chunk
            or r.num_output_placeholders
            or r.num_in_flight_tokens
            or r.num_stale_output_tokens
            or r.spec_token_ids
            or r.sampling_params.stop_token_ids
        ):
            return False
        eos = r.eos_token_id
        if eos is not None and eos != self._eos_checked:
            if self._can_sample(eos):
                return False  # it could stop on a sampled EOS
            self._eos_checked = eos
        # Step j from now appends output number o + j: it finishes once that
        # reaches max_tokens, or the sequence reaches max_model_len.
        left = r.max_tokens - len(r._output_token_ids)
        cap = s.max_model_len - r.num_tokens
        steps = left if left < cap else cap
        if steps < 1:
            return False
        now = s.current_step
        bs = self.block_size
        kvm = s.kv_cache_manager
        if kvm.enable_caching and kvm.num_cached_block.get(r.request_id, 0) != computed // bs:
            return False  # a block its tokens fill is not cached yet (a KV load's): its next allocation caches it
        blocks = kvm.req_to_blocks.get(r.request_id)
        held = len(blocks) if blocks is not None else 0
        # Step j from now needs slots for computed + j tokens.
        due = held * bs - computed + 1
        r.steady_finish = finish = now + steps
        r.steady_due = due = now + (due if due > 1 else 1)
        if due > now + bs:
            self.spare.add(r)
        r.steady_offset = computed - now
        r.steady_written = now
        r.steady_shadow_at = now
        self.members[r] = None
        self.ids[r.request_id] = None
        bucket = self.by_finish.get(finish)
        if bucket is None:
            self.by_finish[finish] = [r]
        else:
            bucket.append(r)
        self.by_residue[due % bs].append(r)
        self.computed_offset += r.steady_offset
        return True

    def leave(self, r: Request) -> None:
        """A member reached its length cap (the caller drops it from running)."""
        del self.members[r]
        del self.ids[r.request_id]
        bucket = self.by_finish[r.steady_finish]
        bucket.remove(r)
        if not bucket:
            del self.by_finish[r.steady_finish]
        self.by_residue[r.steady_due % self.block_size].remove(r)
        self.computed_offset -= r.steady_offset
        self.spare.discard(r)

    # ------------------------------------------------------- lazy counters
    def settle(self, s: CohortHost, shadow: bool = True) -> None:
        """Write every member's counters as the steps so far left them
        (the module docstring), and issue their owed shadow-KV decodes
        (engine/steady_shadow.py; not with `shadow=False`): before anything
        but a steady path reads them."""
        if not self.owed:
            return
        self.owed = False
        now, in_flight, token_at = s.current_step, int(self.in_flight), self.token_at
        seq = s.sched_step_seq if s.defer_block_free else None
        lag = self.shadow_lag if shadow else None
        upto = now - lag.in_flight if lag is not None else 0
        for r in self.members:
            if r.status <= RequestStatus.PREEMPTED:  # (one aborted meanwhile keeps what its abort left)
                write_counters(r, now, in_flight, seq, token_at)
                if lag is not None:
                    lag.catch_up(r, upto)
        if lag is not None:
            lag.prune(self.members)

    def settle_one(self, s: CohortHost, r: Request, shadow_upto: int | None = None) -> None:
        """`settle` for member `r` alone (it is about to finish); its shadow
        decodes up to step `shadow_upto` (default: the steps run so far)."""
        seq = s.sched_step_seq if s.defer_block_free else None
        write_counters(r, s.current_step, int(self.in_flight), seq, self.token_at)
        lag = self.shadow_lag
        if lag is not None:
            lag.catch_up(r, s.current_step - lag.in_flight if shadow_upto is None else shadow_upto)

    # --------------------------------------------------------------- reading
    def takers(self, step: int, ended: set[Request]) -> list[Request]:
        """The members that take a new block at absolute step `step`, in
        running order, but for those in `ended` (finished before it)."""
        members = self.by_residue[step % self.block_size]
        if self.spare:
            return [r for r in members if r.steady_due <= step and r not in ended]
        if ended:
            return [r for r in members if r not in ended]
        return list(members)

    def cachers(self, step: int, ended: set[Request]) -> list[Request]:
        """With prefix caching: the members whose tokens complete a block at
        absolute step `step` (`allocate_slots` caches it then), in running
        order, but for those in `ended`. A member fills its block the step
        before it takes the next one, so they are the next step's residue
        (spare blocks or not)."""
        members = self.by_residue[(step + 1) % self.block_size]
        if ended:
            return [r for r in members if r not in ended]
        return list(members)

    def blocks_taken(self, r: Request, after: int, upto: int) -> int:
        """The blocks member `r` takes at steps after `after`, up to `upto`."""
        bs = self.block_size
        first = r.steady_due
        if first <= after:
            first += ((after - first) // bs + 1) * bs
        return 0 if first > upto else (upto - first) // bs + 1

    def due_after(self, due: int, now: int) -> int:
        """The first step after `now` of a member whose first block step is `due`."""
        if due > now:
            return due
        return due + ((now - due) // self.block_size + 1) * self.block_size


def write_counters(r: Request, now: int, in_flight: int, seq: int | None, token_at: Callable[[str, int], int]) -> None:
    """A member's counters at step `now` (`in_flight`: 1 while a steady
    step is in flight): what one-token-a-step decoding since they were last
    written leaves; `seq`, the newest step's fence number (None: no fence)."""
    computed = r.steady_offset + now
    if r.steady_written != now:  # every step since included it
        r.num_computed_tokens = computed
        r.steady_written = now
        if seq is not None:
            r.last_sched_seq = seq
    r.num_in_flight_tokens = in_flight
    owed = computed + 1 - in_flight - r.num_tokens
    if owed > 0:
        r.append_unsampled(owed, token_at)


def sync(s: CohortHost, sampler: DeterministicSampler) -> tuple[SteadyCohort, list[Request]] | None:
    """The scheduler's cohort, brought up to its running list: kept if it
    matches, extended by requests appended since, built again otherwise;
    with its members in running order (a list of their own). None if a
    running request is not in steady decode."""
    cohort = s.steady_cohort
    running = s.running
    if cohort is not None and cohort.epoch == s.steady_epoch:
        members = list(cohort.members)
        if running == members:
            return _checked(s, cohort, sampler), members
        k = len(members)
        if len(running) > k and running[:k] == members:
            for r in running[k:]:
                if not cohort.join(s, r):
                    return None  # it stays out; the joins before it stay
            return _checked(s, cohort, sampler), list(running)
    if cohort is not None:
        cohort.settle(s)  # its members are read from scratch now
    s.steady_cohort = None
    cohort = SteadyCohort(s, sampler)
    for r in running:
        if not cohort.join(s, r):
            return None
    s.steady_cohort = cohort
    return cohort, list(running)


def _checked(s: CohortHost, cohort: SteadyCohort, sampler: DeterministicSampler) -> SteadyCohort:
    if CHECK:
        _check(s, cohort, sampler)
    return cohort


def _check(s: CohortHost, cohort: SteadyCohort, sampler: DeterministicSampler) -> None:
    """The cohort against one built from scratch (with every member's
    counters settled for it, then put back as they were, so the lazy state
    the run goes on with is the one checked), and every member's counters
    ones the steady paths can have left."""
    now = s.current_step
    kvm = s.kv_cache_manager
    for r in cohort.members:
        written = r.num_computed_tokens - r.steady_offset
        assert written == r.steady_written <= now and r.num_in_flight_tokens in (0, 1), (
            f"{r.request_id}: a cohort member no longer in steady decode (counters changed outside the steady "
            f"paths: written for step {written}, {r.steady_written} recorded, step {now}, "
            f"{r.num_in_flight_tokens} in flight)"
        )
        assert r.num_tokens == r.num_computed_tokens + 1 - r.num_in_flight_tokens, (
            f"{r.request_id}: a cohort member no longer in steady decode ({r.num_tokens} tokens, "
            f"{r.num_computed_tokens} computed, {r.num_in_flight_tokens} in flight)"
        )
        assert len(r._output_token_ids) == r.num_tokens - r.num_prompt_tokens
        if kvm.enable_caching:
            cached, due = kvm.num_cached_block.get(r.request_id, 0), (r.steady_offset + now) // cohort.block_size
            assert cached == due, f"{r.request_id}: {cached} blocks cached at step {now}, {due} due"
    keep = (
        "num_computed_tokens", "num_tokens", "num_in_flight_tokens", "last_sched_seq", "_token_source",
        "steady_written", "steady_shadow_at",
    )  # fmt: skip
    saved = {r: tuple(getattr(r, k) for k in keep) for r in cohort.members}
    owed = cohort.owed
    cohort.settle(s, shadow=False)  # (issuing shadow decodes cannot be put back)
    fresh = SteadyCohort(s, sampler)
    lazy = {id(r): (r.steady_finish, r.steady_due, r.steady_offset) for r in cohort.members}
    for r in s.running:
        assert fresh.join(s, r), f"{r.request_id}: a cohort member no longer in steady decode"
    for r in cohort.members:
        finish, due, offset = lazy[id(r)]
        r_fresh = (r.steady_finish, r.steady_due, r.steady_offset)
        kept = (finish, cohort.due_after(due, now), offset)
        assert kept == r_fresh, f"{r.request_id}: cohort has {kept}, the running batch says {r_fresh}"
        r.steady_finish, r.steady_due, r.steady_offset = finish, due, offset
        values = saved[r]
        del r._output_token_ids[len(r._output_token_ids) - (r.num_tokens - values[1]) :]
        for k, v in zip(keep, values):
            setattr(r, k, v)
    cohort.owed = owed
    assert list(fresh.members) == list(cohort.members) and fresh.computed_offset == cohort.computed_offset
