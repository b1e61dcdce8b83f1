"""The v1 `Scheduler`: vLLM 0.33.0's `schedule()` pass
(`vllm/v1/core/sched/scheduler.py`) for one full-attention KV group, with the
deferred block-free fence and a switch between the cascade fix (PR #49675)
and the pre-fix retry.

The scheduler is its state (scheduler_state.py) plus vLLM's methods; the
passes are functions over that state in their own modules: the waiting-queue
pass in `waiting_pass.py`; a step's `SchedulerOutput` and the bookkeeping once
it is scheduled in `step_output.py`; output processing, finishes and aborts
in `output_processor.py`; frees and the fence in `free_path.py`. This module
builds steps (the running pass) and answers the engine loop.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import fast_paths, output_processor
from .bulk_step import schedule_bulk
from .config import VllmConfig
from .free_path import free_request_blocks
from .kv_cache_manager import NO_NEW_BLOCKS, KVCacheBlocks, cdiv
from .kv_connector.base import KVConnectorBase
from .outputs import EngineCoreOutputs, ModelRunnerOutput, SchedulerOutput
from .request import Request, RequestStatus
from .scheduler_state import SchedulerState
from .step_output import make_scheduler_output, seal, step_begins
from .waiting_pass import schedule_waiting


class Scheduler(SchedulerState):
    # ------------------------------------------------------------------ queue
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        if request.num_prompt_tokens > self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt of {request.num_prompt_tokens} tokens exceeds "
                f"max_model_len={self.max_model_len}"
            )
        self._enqueue_waiting_request(request)
        self.requests[request.request_id] = request
        if self.connector is not None:
            self.connector.on_new_request(request)

    def _enqueue_waiting_request(self, request: Request) -> None:
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            self.deferred_waiting.add(request)
        if self._holds_kv_blocks(request):
            self.kv_holding_waiting.add_request(request)
        else:
            self.waiting.add_request(request)

    def get_num_unfinished_requests(self) -> int:
        running, waiting = self.get_request_counts()
        return running + waiting

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        if self.finished_req_ids:
            return True
        if self.connector is None:
            return False
        running, waiting = self.get_request_counts()
        return len(self.requests) > running + waiting

    def has_requests(self) -> bool:
        return (
            self.has_unfinished_requests()
            or self.has_finished_requests()
            or (self.connector is not None and self.connector.has_pending_push_work())
        )

    def get_kv_cache_usage(self) -> float:
        return self.kv_cache_manager.usage

    def num_waiting_for_remote_kvs(self) -> int:
        if self.connector is None:  # only a connector's async load puts a request in that state
            return 0
        return sum(1 for r in self.kv_holding_waiting if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS)

    # ----------------------------------------- the engine loop's scheduler protocol
    def advance_clock(self, now: float) -> None:
        """v1 schedules without a clock (the v0 scheduler needs one)."""

    def step_needs_update(self, scheduler_output: SchedulerOutput) -> bool:
        """An empty v1 step changes nothing its update would report."""
        return False

    def get_num_free_gpu_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.get_num_free_blocks()

    def get_num_total_gpu_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.num_gpu_blocks - 1  # without the null block

    def get_preemption_totals(self) -> tuple[int, int]:
        """(preemptions, zero-progress preemptions) so far."""
        return self.counters.num_preemptions, self.counters.num_zero_progress_preemptions

    # --------------------------------------------------------------- schedule
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        if not (self.running or self.waiting or self.kv_holding_waiting) and fast_paths.enabled():
            return self._schedule_nothing()
        if self.bulk_token_outputs and not throttle_prefills and self.sampler is not None and fast_paths.enabled():
            # Every running request decoding one token: their share in bulk
            # (engine/bulk_step.py), or None and the full pass below.
            bulk = schedule_bulk(self, self.sampler)
            if bulk is not None:
                return bulk
        step_begins(self)
        scheduled_new_reqs: list[Request] = []
        scheduled_resumed_reqs: list[Request] = []
        scheduled_running_reqs: list[Request] = []
        preempted_reqs: list[Request] = []
        req_to_new_blocks: dict[str, KVCacheBlocks] = {}
        num_scheduled_tokens: dict[str, int] = {}
        token_budget = self.max_num_scheduled_tokens
        input_budget = self.scheduler_config.max_num_batched_tokens
        kvm = self.kv_cache_manager

        defer_prefills = (throttle_prefills and not self.prefill_capacity_bound) and any(
            not r.is_prefill_chunk for r in self.running
        )
        num_running, num_waiting = self.get_request_counts()
        long_prefill_threshold = (
            self.scheduler_config.long_prefill_token_threshold if num_running + num_waiting > 1 else 0
        )

        # ---- running requests
        running = self.running
        req_index = 0
        priority = self.policy == "priority"
        allocate_slots = kvm.allocate_slots
        lookahead = self.num_lookahead_tokens
        max_model_len = self.max_model_len
        # Exact fast path (engine/fast_paths.py): a running request whose last
        # block has room, and whose step completes no block to cache, needs no
        # allocate_slots call — the call would only count itself and return no
        # blocks (no watermark applies to a running request). Not when the
        # allocator is wrapped (a test that counts or fails its calls; a
        # compiled build's manager has no __dict__ and cannot be wrapped).
        plain = fast_paths.enabled() and "allocate_slots" not in getattr(kvm, "__dict__", ())
        req_to_blocks = kvm.req_to_blocks if plain else None
        num_cached_block = kvm.num_cached_block if kvm.enable_caching else None
        block_size = self.block_size
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            placeholders = request.num_output_placeholders
            computed = request.num_computed_tokens
            # Async guard: the step in flight already yields the last token.
            if placeholders > 0 and computed + 2 - placeholders >= request.num_prompt_tokens + request.max_tokens:
                req_index += 1
                continue
            if defer_prefills and request.is_prefill_chunk:
                req_index += 1
                continue
            num_new_tokens = request.num_tokens + len(request.spec_token_ids) + placeholders - computed
            if 0 < long_prefill_threshold < num_new_tokens:
                num_new_tokens = long_prefill_threshold
            if num_new_tokens > token_budget:
                num_new_tokens = token_budget
            if num_new_tokens > input_budget:
                num_new_tokens = input_budget
            if num_new_tokens > max_model_len - computed - 1:
                num_new_tokens = max_model_len - computed - 1
            if num_new_tokens <= 0:
                req_index += 1
                continue

            new_blocks = None
            if req_to_blocks is not None:
                have = req_to_blocks.get(request.request_id)
                if have is not None and computed + num_new_tokens + lookahead <= len(have) * block_size:
                    if num_cached_block is None or (
                        # The blocks `allocate_slots` would have cached by then.
                        min(computed + num_new_tokens, request.num_tokens) // block_size
                        <= num_cached_block.get(request.request_id, 0)
                    ):
                        kvm.num_allocate_slots_calls += 1  # the call it stands for
                        new_blocks = NO_NEW_BLOCKS

            while new_blocks is None:
                new_blocks = allocate_slots(request, num_new_tokens, num_lookahead_tokens=lookahead)
                if new_blocks is not None:
                    break
                if self.connector is not None and self.connector.has_pending_block_frees():
                    break
                # Pick the victim without mutating anything.
                if priority:
                    victim = max(running, key=lambda r: (r.priority, r.arrival_time))
                else:
                    victim = running[-1]
                # PR #49675: a fenced victim frees nothing now; stop the retry.
                if not self._request_blocks_can_be_freed(victim):
                    self.counters.num_fence_stopped_retries += 1
                    if not self.prefix_guard:
                        break
                if priority:
                    victim_index = running.index(victim)
                    del running[victim_index]
                    # PR #49206: any victim before the cursor shifts it.
                    if victim_index < req_index:
                        req_index -= 1
                    if victim in scheduled_running_reqs:
                        scheduled_running_reqs.remove(victim)
                        restored = num_scheduled_tokens.pop(victim.request_id)
                        token_budget += restored
                        input_budget += restored
                        req_to_new_blocks.pop(victim.request_id)
                else:
                    running.pop()
                self._preempt_request(victim)
                preempted_reqs.append(victim)
                if victim is request:
                    break

            if new_blocks is None:
                if priority and request.status == RequestStatus.PREEMPTED:
                    # It preempted itself; req_index already points at the next one.
                    continue
                break

            scheduled_running_reqs.append(request)
            req_to_new_blocks[request.request_id] = new_blocks
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            input_budget -= num_new_tokens
            req_index += 1
            if request.spec_token_ids:
                request.spec_token_ids = []

        # ---- waiting requests (never after a preemption in this step)
        if not preempted_reqs:
            token_budget = schedule_waiting(
                self,
                token_budget,
                input_budget,
                defer_prefills,
                long_prefill_threshold,
                scheduled_new_reqs,
                scheduled_resumed_reqs,
                req_to_new_blocks,
                num_scheduled_tokens,
            )

        total_num_scheduled_tokens = sum(num_scheduled_tokens.values())
        assert total_num_scheduled_tokens <= self.max_num_scheduled_tokens
        assert len(self.running) <= self.max_num_running_reqs

        scheduler_output = make_scheduler_output(
            self,
            scheduled_new_reqs,
            scheduled_running_reqs,
            scheduled_resumed_reqs,
            req_to_new_blocks,
            num_scheduled_tokens,
            total_num_scheduled_tokens,
        )
        seal(self, scheduler_output)
        return scheduler_output

    def _schedule_nothing(self) -> SchedulerOutput:
        """`schedule()` with no request running or waiting (engine/fast_paths.py):
        what the full pass leaves, without walking its empty queues — a
        prefill node does this about once per request, between a prompt's step
        and the done report that frees its held blocks. The step still counts,
        reports the requests finished since the last one, and carries the
        connector's metadata."""
        step_begins(self)
        self.prefill_capacity_bound = False  # the waiting pass's verdict: no request waits
        so = make_scheduler_output(self, [], [], [], {}, {}, 0)
        seal(self, so)
        return so

    def _preempt_request(self, request: Request, drop_stale_output: bool | None = None) -> None:
        """Put a RUNNING request back at the head of `waiting` (the caller has
        already removed it from `running`)."""
        assert request.status == RequestStatus.RUNNING, "Only running requests can be preempted"
        if drop_stale_output is None:
            drop_stale_output = self.requires_kv_delivery
        self.counters.num_preemptions += 1
        if not self._request_blocks_can_be_freed(request):
            self.counters.num_zero_progress_preemptions += 1
        free_request_blocks(self, request)
        self._inflight_prefills.discard(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        if request.spec_token_ids:
            request.spec_token_ids = []
        request.drop_stale_output = drop_stale_output or (
            request.drop_stale_output and request.num_stale_output_tokens > 0
        )
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.reset_preempted_req_ids.add(request.request_id)

    # --------------------------------------------- output processing (output_processor.py)
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        return output_processor.update_from_output(self, scheduler_output, model_runner_output)

    def finish_requests(self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus) -> list[Request]:
        """Finish requests from outside (aborts, errors); ignores unknown and
        already-finished ids; returns the requests it finished."""
        return output_processor.finish_requests(self, request_ids, finished_status)

    def num_deferred_free_blocks(self) -> int:
        return self.counters.deferred_free_blocks

    def get_counters(self) -> dict[str, int]:
        return output_processor.get_counters(self)


class AsyncScheduler(Scheduler):
    """vLLM's `AsyncScheduler`: every scheduled decode adds an output
    placeholder, so the next step can be built before this one's output."""

    adds_output_placeholders = True  # (step_output.py `update_after_schedule` adds them)


def create_scheduler_for(vllm_config: VllmConfig, connector: KVConnectorBase | None = None) -> Scheduler:
    cls = AsyncScheduler if vllm_config.scheduler_config.async_scheduling else Scheduler
    return cls(vllm_config, connector)


__all__ = ["Scheduler", "AsyncScheduler", "create_scheduler_for", "cdiv"]
