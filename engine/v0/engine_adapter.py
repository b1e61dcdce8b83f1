"""The v0 scheduler behind the v1 scheduler's interface, so a node configured
with `engine: v0` runs in the same engine loop as a v1 node.

`V0SchedulerAdapter` speaks v1's types (`engine.request.Request`,
`engine.outputs.SchedulerOutput` / `ModelRunnerOutput` / `EngineCoreOutputs`)
and does what vLLM 0.5.3's `LLMEngine.step()` does around `Scheduler.schedule()`:
advance each scheduled group's computed tokens, append the sampled token when
the group samples, run the stop checks, free finished sequences and groups.

Conventions shared with v1: sampled tokens come one per scheduled request that
samples, `[]` for a prefill chunk that does not finish the prompt (tokens sent
for such a chunk are discarded, as v1 does); `request.is_prefill_chunk` tells
the executor which is which. Ignored prompts (FINISHED_IGNORED) appear in the
same step's `finished_req_ids` and get an output with finish reason "length".
Depth 1 only: v0 has no batch queue, so every `schedule()` must be followed by
its `update_from_output()` before the next one (a step with nothing to update,
which the engine loop drops, is discarded at the next `schedule()`). Request
statuses are mirrored onto the v1 `Request`: SWAPPED and recompute-preempted
both show as PREEMPTED.

For the engine loop (`engine.engine_core.EngineScheduler`) it also takes the
time of each step (`advance_clock`), says which empty steps must still be
updated (`step_needs_update`), and hands the worker the step's swap copies
(`get_swap_mappings`); its numbers and vLLM's v0 metrics are in `adapter_stats`.
"""

from __future__ import annotations

import itertools
import logging

from engine.outputs import (
    CachedRequestData,
    EngineCoreOutput,
    EngineCoreOutputs,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    SteadyTokens,
)
from engine.request import Request, RequestStatus
from engine.v0.adapter_stats import V0StatsMixin
from engine.v0.config import CacheConfig, SchedulerConfig
from engine.v0.gauges import QueueGauges
from engine.v0.loglines import LOGGER_NAME, V0StatLogger, format_num_blocks
from engine.v0.scheduler import Scheduler
from engine.v0.scheduler_outputs import SchedulerOutputs
from engine.v0.sequence import Sequence, SequenceGroup, SequenceStage, SequenceStatus
from engine.v0.stop_checker import maybe_stop_sequence

logger = logging.getLogger(LOGGER_NAME)

_TO_SEQ_STATUS = {
    RequestStatus.FINISHED_STOPPED: SequenceStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH_CAPPED: SequenceStatus.FINISHED_LENGTH_CAPPED,
    RequestStatus.FINISHED_ABORTED: SequenceStatus.FINISHED_ABORTED,
    RequestStatus.FINISHED_IGNORED: SequenceStatus.FINISHED_IGNORED,
    # v0 has no error status; the v1 request keeps FINISHED_ERROR.
    RequestStatus.FINISHED_ERROR: SequenceStatus.FINISHED_ABORTED,
}
_TO_REQUEST_STATUS = {
    SequenceStatus.WAITING: RequestStatus.WAITING,
    SequenceStatus.RUNNING: RequestStatus.RUNNING,
    SequenceStatus.SWAPPED: RequestStatus.PREEMPTED,
    SequenceStatus.FINISHED_STOPPED: RequestStatus.FINISHED_STOPPED,
    SequenceStatus.FINISHED_LENGTH_CAPPED: RequestStatus.FINISHED_LENGTH_CAPPED,
    SequenceStatus.FINISHED_ABORTED: RequestStatus.FINISHED_ABORTED,
    SequenceStatus.FINISHED_IGNORED: RequestStatus.FINISHED_IGNORED,
}


class V0SchedulerAdapter(V0StatsMixin):
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        *,
        start_time: float = 0.0,
        log_startup: bool = True,
    ) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.scheduler = Scheduler(scheduler_config, cache_config)
        self.requests: dict[str, Request] = {}
        self.seq_groups: dict[str, SequenceGroup] = {}
        self._seq_ids = itertools.count()
        # Finished since the last schedule(): reported in the next SchedulerOutput.
        self._finished_req_ids: set[str] = set()
        self._in_flight: tuple[SchedulerOutput, list[bool], SchedulerOutputs] | None = None
        self.last_scheduler_outputs: SchedulerOutputs | None = None
        self.step_index = 0
        self.now = start_time
        self.stat_logger = V0StatLogger(start_time)
        self.last_stat_line: str | None = None
        self.gauges = QueueGauges()
        if log_startup:
            logger.info(format_num_blocks(cache_config.num_gpu_blocks, cache_config.num_cpu_blocks))

    # -- requests ----------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        rid = request.request_id
        if rid in self.seq_groups:
            raise ValueError(f"request {rid!r} is already in the v0 scheduler; request ids must be unique")
        seq = Sequence(
            next(self._seq_ids),
            request.prompt_token_ids,
            self.cache_config.block_size,
            eos_token_id=request.eos_token_id,
        )
        group = SequenceGroup(rid, seq, request.arrival_time, request.sampling_params)
        group.request = request
        request.status = RequestStatus.WAITING
        self.requests[rid] = request
        self.seq_groups[rid] = group
        self.scheduler.add_seq_group(group)

    def finish_requests(self, request_ids: str | list[str] | set[str], finished_status: RequestStatus) -> None:
        """Abort/finish from outside (client abort, remote error). Unknown or
        already finished ids are ignored, as in v1."""
        if finished_status not in _TO_SEQ_STATUS:
            raise ValueError(
                f"finished_status={finished_status!r} is invalid; allowed: {sorted(s.name for s in _TO_SEQ_STATUS)}"
            )
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        live = [rid for rid in ids if rid in self.seq_groups]
        self.scheduler.abort_seq_group(live, _TO_SEQ_STATUS[finished_status])
        for rid in live:
            self._retire(rid, finished_status)

    def has_requests(self) -> bool:
        return self.scheduler.has_unfinished_seqs() or bool(self._finished_req_ids)

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_seq_groups()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_seqs()

    def has_finished_requests(self) -> bool:
        return bool(self._finished_req_ids)

    def _retire(self, rid: str, status: RequestStatus) -> None:
        self.requests.pop(rid).status = status
        del self.seq_groups[rid]
        self._finished_req_ids.add(rid)

    # -- one step ------------------------------------------------------------------
    def advance_clock(self, now: float) -> None:
        """The engine loop's time for the next step. vLLM v0 reads its clock in
        `schedule()` and logs its stats line at the end of the previous step --
        at depth 1 the same instant, so the line is due here."""
        self.now = now
        if now - self.stat_logger.last_local_log > self.stat_logger.local_interval:
            self.log_stats(now)

    def step_needs_update(self, scheduler_output: SchedulerOutput) -> bool:
        """A step that schedules no tokens still has outputs for its ignored
        prompts, and after a preemption the next pass will differ: the engine
        loop must run its update rather than go idle."""
        if self._in_flight is None or self._in_flight[0] is not scheduler_output:
            return False
        outs = self._in_flight[2]
        return bool(outs.ignored_seq_groups or outs.preempted)

    def get_swap_mappings(
        self, scheduler_output: SchedulerOutput
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The block copies the worker performs before running this step:
        (blocks_to_swap_out as (gpu, cpu), blocks_to_swap_in as (cpu, gpu))."""
        if self._in_flight is None or self._in_flight[0] is not scheduler_output:
            raise RuntimeError("get_swap_mappings() needs the SchedulerOutput of the last schedule()")
        outs = self._in_flight[2]
        return outs.blocks_to_swap_out, outs.blocks_to_swap_in

    def schedule(self, now: float | None = None) -> SchedulerOutput:
        if self._in_flight is not None:
            if self._in_flight[2].scheduled_seq_groups or self.step_needs_update(self._in_flight[0]):
                raise RuntimeError(
                    "the v0 scheduler runs at depth 1: call update_from_output() for the previous "
                    "SchedulerOutput before scheduling again"
                )
            self._in_flight = None  # an empty step the engine loop dropped: nothing to update
        if now is not None:  # driven by hand; the engine loop calls advance_clock() instead
            self.now = now
        outs = self.scheduler.schedule_outputs(self.now)
        self.step_index += 1
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        cached_ids, cached_computed, cached_blocks = cached.req_ids, cached.num_computed_tokens, cached.new_block_ids
        swapped_in = {g.request_id for g in outs.swapped_in_seq_groups}
        num_scheduled_tokens: dict[str, int] = {}
        partial: set[str] = set()
        tables = self.scheduler.block_manager.block_tables
        running, prefill = RequestStatus.RUNNING, SequenceStage.PREFILL
        # Per scheduled group: does it sample (for update_from_output).
        plan: list[bool] = []
        # Runs for every scheduled request every step: kept to plain attribute work.
        for scheduled in outs.scheduled_seq_groups:
            group = scheduled.seq_group
            rid, seq, chunk = group.request_id, group.seqs[0], scheduled.token_chunk_size
            request = group.request
            assert request is not None  # add_request sets it before queueing the group
            computed = seq._num_computed_tokens
            is_prompt = seq._stage is prefill
            do_sample = not is_prompt or chunk + computed >= seq._len  # scheduler.samples(), inlined
            plan.append(do_sample)
            num_scheduled_tokens[rid] = chunk
            request.status = running
            request.num_computed_tokens = computed
            if do_sample:
                request.is_prefill_chunk = False
            else:
                request.is_prefill_chunk = True
                partial.add(rid)
            # The block manager's live table: copy what leaves this method.
            table = tables[seq.seq_id]
            if is_prompt and computed == 0:  # a new prefill, or a recomputed victim's
                new_reqs.append(NewRequestData(rid, seq.get_prompt_len(), list(table), 0))
            else:
                cached_ids.append(rid)
                cached_computed.append(computed)
                if rid in swapped_in:  # a fresh block table, as for v1's resumed requests
                    cached.resumed_req_ids.add(rid)
                    cached_blocks.append(list(table))
                else:  # only the blocks the worker does not know yet
                    known = group.num_known_blocks
                    cached_blocks.append(table[known:] if len(table) > known else None)
            group.num_known_blocks = len(table)
        preempted_ids = set()
        for group in outs.preempted_seq_groups + outs.swapped_out_seq_groups:
            preempted_ids.add(group.request_id)
            request = self.requests[group.request_id]
            request.status = RequestStatus.PREEMPTED
            request.num_preemptions += 1
            request.num_computed_tokens = group.seq.get_num_computed_tokens()
        for group in outs.ignored_seq_groups:
            self._retire(group.request_id, RequestStatus.FINISHED_IGNORED)
        finished, self._finished_req_ids = self._finished_req_ids, set()
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=sum(num_scheduled_tokens.values()),
            scheduled_spec_decode_tokens={},
            num_common_prefix_blocks=[],
            finished_req_ids=finished,
            preempted_req_ids=preempted_ids,
            step_index=self.step_index,
            partial_prefill_req_ids=partial,
        )
        self._in_flight = (out, plan, outs)
        self.last_scheduler_outputs = outs
        return out

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        if self._in_flight is None or self._in_flight[0] is not scheduler_output:
            raise RuntimeError(
                "update_from_output() must receive the SchedulerOutput of the last schedule() "
                "(the v0 scheduler runs at depth 1)"
            )
        _, plan, outs = self._in_flight
        self._in_flight = None
        max_model_len = self.scheduler_config.max_model_len
        outputs: list[EngineCoreOutput | SteadyTokens] = []
        finished_ids: set[str] = set()
        num_prompt_tokens = num_generation_tokens = 0
        num_prefill_groups = outs.num_prefill_groups
        swapped = SequenceStatus.SWAPPED  # every status above it is a finished one
        decode = SequenceStage.DECODE
        req_id_to_index = model_runner_output.req_id_to_index
        sampled_token_ids = model_runner_output.sampled_token_ids
        free_seq = self.scheduler.free_seq
        now = self.now
        # Runs for every scheduled request every step: kept to plain attribute work.
        for scheduled in outs.scheduled_seq_groups[:num_prefill_groups]:
            if scheduled.seq_group.seqs[0].status <= swapped:
                num_prompt_tokens += scheduled.token_chunk_size
        for do_sample, scheduled in zip(plan, outs.scheduled_seq_groups):
            group = scheduled.seq_group
            seq = group.seqs[0]
            if seq.status > swapped:  # finished from outside between schedule() and now
                continue
            computed = seq._num_computed_tokens + scheduled.token_chunk_size
            if computed < seq._len:  # a prefill chunk short of the end: the general path
                seq.update_num_computed_tokens(scheduled.token_chunk_size)
            else:  # Sequence.update_num_computed_tokens to the end of the sequence, inlined
                if computed > seq._len:
                    raise AssertionError(f"sequence {seq.seq_id}: computed {computed} > length {seq._len}")
                seq._num_computed_tokens = computed
                seq._stage = decode
            rid = group.request_id
            request = group.request
            assert request is not None  # add_request sets it before queueing the group
            request.num_computed_tokens = computed
            request.is_prefill_chunk = False
            if not do_sample:
                continue
            sampled = sampled_token_ids[req_id_to_index[rid]] if rid in req_id_to_index else []
            if len(sampled) != 1:
                raise ValueError(
                    f"request {rid!r} samples this step and needs exactly one sampled token "
                    f"(v0 has no speculative decoding); got {sampled!r}"
                )
            token = sampled[0]
            num_generation_tokens += 1
            seq.output_token_ids.append(token)  # Sequence.append_token_id and
            seq._len += 1
            request._output_token_ids.append(token)  # Request.append_output_token_ids, inlined
            request.num_tokens += 1
            if group.first_token_time is None:
                group.first_token_time = now
            sp = group.sampling_params
            # Only these can stop a sequence (min_tokens only holds a stop back):
            # the full check runs when one of them holds.
            if (
                token == seq.eos_token_id
                or seq._len > max_model_len
                or len(seq.output_token_ids) == sp.max_tokens
                or (sp.stop_token_ids and token in sp.stop_token_ids)
            ):
                maybe_stop_sequence(seq, sp, max_model_len)
            if seq.status > swapped:
                free_seq(seq)
                request.stop_reason = seq.stop_reason
                group.finished_time = now
                finished_ids.add(rid)
                outputs.append(
                    EngineCoreOutput(
                        rid,
                        sampled,
                        SequenceStatus.get_finished_reason(seq.status),
                        seq.stop_reason,
                        num_preemptions=request.num_preemptions,
                    )
                )
            else:
                outputs.append(EngineCoreOutput(rid, sampled))
        if finished_ids:
            # Only this loop finishes a running group (aborts and ignored prompts
            # leave their queues at once), so without a finish the scan finds nothing.
            self.scheduler.free_finished_seq_groups()
        for rid in finished_ids:
            self._retire(rid, _TO_REQUEST_STATUS[self.seq_groups[rid].seq.status])
        for group in outs.ignored_seq_groups:
            assert group.request is not None  # add_request sets it before queueing the group
            outputs.append(
                EngineCoreOutput(group.request_id, [], "length", num_preemptions=group.request.num_preemptions)
            )
            finished_ids.add(group.request_id)
        self.stat_logger.record(num_prompt_tokens, num_generation_tokens)
        self._sample_gauges()
        return {0: EngineCoreOutputs(outputs=outputs, finished_requests=finished_ids)}
