"""The worker side of one node without a model: it keeps the per-request
block tables the way vLLM's runner does (from `SchedulerOutput` deltas),
gives each step its shape for the cost model, performs the shadow KV reads
and writes when the step completes, and samples deterministic tokens.

With the v0 scheduler's swap space, it also does what vLLM v0's cache engine
does before a step runs: copy swapped-out blocks' content to CPU blocks and
swapped-in blocks' content back to (new) GPU blocks -- in the shadow store.
v1's `SchedulerOutput` has no field for these copies; the runner asks the
scheduler for them (`swaps`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from . import fast_paths
from .bulk_step import BulkPart
from .cost_model import StepShape
from .kv_connector.pd_connector import RecvSpec
from .outputs import KVConnectorOutput, ModelRunnerOutput, SchedulerOutput
from .request import Request
from .sampler import DeterministicSampler
from .shadow_kv import ShadowKVStore
from .steady_batch import SteadyBatch


@dataclass
class _ReqState:
    prompt_len: int
    block_ids: list[int]


class StepEntry(NamedTuple):
    """One request's share of a step, as the worker saw it when the step was
    submitted (a tuple: the plain path builds one per scheduled request)."""

    request_id: str
    block_table: list[int]  # the request's table at submit time (the runner's own list)
    computed_before: int  # its computed tokens before the step
    num_tokens: int  # the step's tokens for it
    samples: bool  # whether the step samples a token for it (not a partial prefill)


class SteadyStepPart(Protocol):
    """What the runner reads of a steady step's part (engine/steady_step.py
    `SteadyPart`), declared here so the runner imports none of the steady
    paths' drivers."""

    new_blocks: list[tuple[Request, int]]
    batch: SteadyBatch


@dataclass
class StepPlan:
    """A submitted step as the worker saw it when it was scheduled."""

    scheduler_output: SchedulerOutput
    shape: StepShape
    entries: list[StepEntry] = field(default_factory=list)
    # The step's steady-decode requests, handled in bulk (engine/steady_step.py,
    # engine/bulk_step.py).
    steady: BulkPart | SteadyStepPart | None = None
    # A bulk step's requests' block tables when it was submitted (with a shadow store).
    bulk_tables: list[list[int]] | None = None

    def loads(self) -> list[RecvSpec]:
        """The KV loads this step starts (the connector's `reqs_to_recv`)."""
        meta = self.scheduler_output.kv_connector_metadata
        reqs = getattr(meta, "reqs_to_recv", None) if meta is not None else None
        return list(reqs.values()) if reqs else []


# (blocks to swap out as (gpu, cpu) pairs, blocks to swap in as (cpu, gpu) pairs) of a step.
SwapMappings = tuple[list[tuple[int, int]], list[tuple[int, int]]]


class _CpuShadow:
    """The shadow content of CPU (swap space) blocks: per CPU block, the slot
    tags its GPU source held when it was swapped out."""

    def __init__(self, shadow: ShadowKVStore) -> None:
        self.shadow = shadow
        self.slots: dict[int, list[Any] | None] = {}

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        for gpu, cpu in mapping:
            self.slots[cpu] = self.shadow.snapshot_block(gpu)

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        """Runs after the GPU blocks were assigned to their request, so the
        copied tags count as that request's content (or as foreign content,
        if the block had been clobbered before it was swapped out)."""
        for cpu, gpu in mapping:
            self.shadow.restore_block(gpu, self.slots.pop(cpu, None))


class SimModelRunner:
    def __init__(
        self,
        sampler: DeterministicSampler,
        shadow: ShadowKVStore | None = None,
        swaps: Callable[[SchedulerOutput], SwapMappings] | None = None,
        prefix_caching: bool = False,
        retire_finished: bool = False,
    ) -> None:
        self.sampler = sampler
        self.shadow = shadow
        # Whether a finished request's blocks are never read again once no
        # step in flight includes it (not so on a KV producer: a pull reads a
        # finished prompt's blocks), so the shadow store may stop tracking it.
        self.retires = shadow is not None and retire_finished
        # With prefix caching, the blocks of a (re-)admitted request's computed
        # tokens are cache hits; without it, they are its own (a landed KV
        # load, or v0's swapped-in blocks).
        self.prefix_caching = prefix_caching
        self.requests: dict[str, _ReqState] = {}
        # Only a scheduler with swap space (v0) gives swaps.
        self.swaps = swaps
        self.cpu_shadow = _CpuShadow(shadow) if shadow is not None and swaps is not None else None

    def begin_step(self, so: SchedulerOutput) -> StepPlan:
        reqs = self.requests
        shadow = self.shadow
        swap_in: list[tuple[int, int]] = []
        if self.cpu_shadow is not None:
            assert self.swaps is not None  # cpu_shadow exists only with swaps
            swap_out, swap_in = self.swaps(so)
            if swap_out:  # before this step's new owners take the freed GPU blocks over
                self.cpu_shadow.swap_out(swap_out)
        # Preempted requests keep their state (vLLM's runner does too): they
        # come back as resumed requests with a fresh block table.
        for req_id in so.finished_req_ids:
            self.forget(req_id)
        computed_before: dict[str, int] = {}
        bs = shadow.block_size if shadow is not None else 1
        caching = self.prefix_caching
        for new in so.scheduled_new_reqs:
            reqs[new.req_id] = _ReqState(new.prompt_len, list(new.block_ids))
            computed_before[new.req_id] = new.num_computed_tokens
            if shadow is not None:
                # Blocks of tokens already computed are prefix-cache hits (or
                # a landed KV load, which the request owns already).
                hits = new.num_computed_tokens // bs if caching else 0
                shadow.share(new.block_ids[:hits], new.req_id)
                shadow.assign(new.block_ids[hits:], new.req_id)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = reqs[req_id]
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                # Resumed after preemption: a fresh block table, which may
                # start with prefix-cache hits.
                state.block_ids = list(new_ids or [])
                if shadow is not None:
                    hits = cached.num_computed_tokens[i] // bs if caching else 0
                    shadow.share(state.block_ids[:hits], req_id)
                    shadow.assign(state.block_ids[hits:], req_id)
            elif new_ids:
                state.block_ids.extend(new_ids)
                if shadow is not None:
                    shadow.assign(new_ids, req_id)
            computed_before[req_id] = cached.num_computed_tokens[i]

        steady = so.steady
        if steady is not None:
            # Running requests decoding one token each: a block where they took one.
            for r, new_id in steady.new_blocks:
                reqs[r.request_id].block_ids.append(new_id)
            if shadow is not None and steady.new_blocks:
                shadow.assign_each([(new_id, r.request_id) for r, new_id in steady.new_blocks])

        if swap_in and self.cpu_shadow is not None:  # after the resumed requests' fresh tables were assigned
            self.cpu_shadow.swap_in(swap_in)

        prefill = decode = context = decode_context = pairs = 0
        partial = so.partial_prefill_req_ids
        entries: list[StepEntry] = []
        for req_id, n in so.num_scheduled_tokens.items():
            state = reqs[req_id]
            start = computed_before[req_id]
            if start < state.prompt_len:
                prefill += n
                pairs += n * start + n * (n + 1) // 2
            else:
                decode += n
                decode_context += start + n
            context += start + n
            entries.append(StepEntry(req_id, state.block_ids, start, n, req_id not in partial))
        batch_size = len(entries)
        bulk_tables = None
        if type(steady) is BulkPart:
            # Requests decoding one token each, their shape terms summed when scheduled;
            # their block tables as of now (a later step may give one a new table).
            p_, d_, c_, dc_, pairs_ = steady.shape_terms
            prefill += p_
            decode += d_
            context += c_
            decode_context += dc_
            pairs += pairs_
            batch_size += len(steady.members)
            if shadow is not None:
                bulk_tables = [reqs[r.request_id].block_ids for r in steady.members]
        elif steady is not None:
            b = len(steady.batch.requests)
            ctx = steady.batch.context + b
            decode += b
            decode_context += ctx
            context += ctx
            batch_size += b
        return StepPlan(
            so, StepShape(prefill, decode, context, batch_size, decode_context, pairs), entries, steady, bulk_tables
        )

    def forget(self, req_id: str) -> None:
        """A finished request: its block table goes (and the shadow store's read cache)."""
        self.requests.pop(req_id, None)
        if self.shadow is not None:
            self.shadow.forget(req_id)

    def retire(self, req_id: str) -> None:
        """A forgotten request no step in flight includes: the shadow store
        stops tracking it (`ShadowKVStore.retire`), unless a pull may still
        read its blocks here. The engine says when (`EngineCore.queue_step`)."""
        if self.retires:
            self.shadow.retire(req_id)  # type: ignore[union-attr]  # `retires` implies a store

    def register_load(self, request_id: str, block_ids: list[int]) -> None:
        """The target blocks of a KV load belong to `request_id` from now on."""
        if self.shadow is not None:
            self.shadow.assign(block_ids, request_id)

    def finish_step(
        self, plan: StepPlan, now: float, kv_connector_output: KVConnectorOutput | None = None
    ) -> ModelRunnerOutput:
        shadow = self.shadow
        token_at = self.sampler.token_at
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        steady = plan.steady
        if plan.bulk_tables is not None:
            # A bulk step's requests first (they lead the running order), as
            # the entries below: a read up to the token, then its write.
            assert shadow is not None and type(steady) is BulkPart  # the tables are kept only for the store
            shadow.decode_each([r.request_id for r in steady.members], plan.bulk_tables, steady.starts, now)
        elif shadow is not None and steady is not None:
            # One decode each, owed: the cohort issues its members' decodes
            # when it settles them (engine/steady_shadow.py).
            assert not isinstance(steady, BulkPart)  # (with a store, a bulk step keeps its tables)
            lag = steady.batch.cohort.shadow_lag
            assert lag is not None  # made with the store
            lag.steps_done(steady.batch.base + 1, [now])
            lag.in_flight = False
        # A decode's read and write in one call (`ShadowKVStore.decode`: the
        # same findings and marks; engine/fast_paths.py).
        decode = shadow.decode if shadow is not None and fast_paths.enabled() else None
        for req_id, table, start, n, samples in plan.entries:
            if shadow is not None:
                if decode is not None and n == 1 and start:
                    decode(req_id, table, start, 1, now, now)
                else:
                    if start:
                        shadow.read(req_id, table, start, now)
                    shadow.write(req_id, table, start, start + n, now)
            req_ids.append(req_id)
            sampled.append([token_at(req_id, start + n)] if samples else [])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=kv_connector_output,
        )
