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
its `update_from_output()` before the next one. Request statuses are mirrored
onto the v1 `Request`: SWAPPED and recompute-preempted both show as PREEMPTED.
"""

from __future__ import annotations

import itertools
import logging

from engine.outputs import (CachedRequestData, EngineCoreOutput, EngineCoreOutputs, ModelRunnerOutput, NewRequestData,
                            SchedulerOutput)
from engine.request import Request, RequestStatus
from engine.v0.config import CacheConfig, SchedulerConfig
from engine.v0.loglines import LOGGER_NAME, V0Stats, V0StatLogger, format_num_blocks
from engine.v0.scheduler import PreemptionMode, Scheduler
from engine.v0.scheduler_outputs import SchedulerOutputs, SequenceGroupMetadata
from engine.v0.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.v0.starvation import diagnose
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


class V0SchedulerAdapter:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, *,
                 start_time: float = 0.0, log_startup: bool = True) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.scheduler = Scheduler(scheduler_config, cache_config)
        self.requests: dict[str, Request] = {}
        self.seq_groups: dict[str, SequenceGroup] = {}
        self._seq_ids = itertools.count()
        # Finished since the last schedule(): reported in the next SchedulerOutput.
        self._finished_req_ids: set[str] = set()
        self._in_flight: tuple[SchedulerOutput, list[SequenceGroupMetadata], SchedulerOutputs] | None = None
        # Blocks of each request the worker already knows, to send only new ones.
        self._known_blocks: dict[str, int] = {}
        self.last_scheduler_outputs: SchedulerOutputs | None = None
        self.step_index = 0
        self.now = start_time
        self.last_iteration = V0Stats(start_time, 0, 0, 0, 0.0, 0.0)
        self.stat_logger = V0StatLogger(start_time)
        if log_startup:
            logger.info(format_num_blocks(cache_config.num_gpu_blocks, cache_config.num_cpu_blocks))

    # -- requests ----------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        rid = request.request_id
        if rid in self.seq_groups:
            raise ValueError(f"request {rid!r} is already in the v0 scheduler; request ids must be unique")
        seq = Sequence(next(self._seq_ids), request.prompt_token_ids, self.cache_config.block_size,
                       eos_token_id=request.eos_token_id)
        group = SequenceGroup(rid, seq, request.arrival_time, request.sampling_params)
        request.status = RequestStatus.WAITING
        self.requests[rid] = request
        self.seq_groups[rid] = group
        self.scheduler.add_seq_group(group)

    def finish_requests(self, request_ids: str | list[str] | set[str], finished_status: RequestStatus) -> None:
        """Abort/finish from outside (client abort, remote error). Unknown or
        already finished ids are ignored, as in v1."""
        if finished_status not in _TO_SEQ_STATUS:
            raise ValueError(f"finished_status={finished_status!r} is invalid; allowed: "
                             f"{sorted(s.name for s in _TO_SEQ_STATUS)}")
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
        self._known_blocks.pop(rid, None)
        self._finished_req_ids.add(rid)

    # -- one step ------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        if self._in_flight is not None:
            raise RuntimeError("the v0 scheduler runs at depth 1: call update_from_output() for the previous "
                               "SchedulerOutput before scheduling again")
        if now is not None:
            self.now = now
        metadata, outs = self.scheduler.schedule(self.now)
        self.step_index += 1
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        swapped_in = {g.request_id for g in outs.swapped_in_seq_groups}
        num_scheduled_tokens: dict[str, int] = {}
        partial: set[str] = set()
        for meta, scheduled in zip(metadata, outs.scheduled_seq_groups):
            rid, seq = meta.request_id, scheduled.seq_group.seq
            request = self.requests[rid]
            computed = seq.get_num_computed_tokens()
            num_scheduled_tokens[rid] = meta.token_chunk_size
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = computed
            request.is_prefill_chunk = not meta.do_sample
            if request.is_prefill_chunk:
                partial.add(rid)
            table = meta.block_tables[seq.seq_id]
            if meta.is_prompt and computed == 0:  # a new prefill, or a recomputed victim's
                new_reqs.append(NewRequestData(rid, seq.get_prompt_len(), table, 0))
            else:
                cached.req_ids.append(rid)
                cached.num_computed_tokens.append(computed)
                if rid in swapped_in:  # a fresh block table, as for v1's resumed requests
                    cached.resumed_req_ids.add(rid)
                    cached.new_block_ids.append(table)
                else:
                    cached.new_block_ids.append(table[self._known_blocks[rid]:] or None)
            self._known_blocks[rid] = len(table)
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
        self._in_flight = (out, metadata, outs)
        self.last_scheduler_outputs = outs
        return out

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> dict[int, EngineCoreOutputs]:
        if self._in_flight is None or self._in_flight[0] is not scheduler_output:
            raise RuntimeError("update_from_output() must receive the SchedulerOutput of the last schedule() "
                               "(the v0 scheduler runs at depth 1)")
        _, metadata, outs = self._in_flight
        self._in_flight = None
        max_model_len = self.scheduler_config.max_model_len
        outputs: list[EngineCoreOutput] = []
        finished_ids: set[str] = set()
        num_prompt_tokens = num_generation_tokens = 0
        for idx, (meta, scheduled) in enumerate(zip(metadata, outs.scheduled_seq_groups)):
            group = scheduled.seq_group
            if group.is_finished():  # finished from outside between schedule() and now
                continue
            group.update_num_computed_tokens(scheduled.token_chunk_size)
            if idx < outs.num_prefill_groups:
                num_prompt_tokens += scheduled.token_chunk_size
            seq, rid = group.seq, group.request_id
            request = self.requests[rid]
            request.num_computed_tokens = seq.get_num_computed_tokens()
            request.is_prefill_chunk = False
            if not meta.do_sample:
                continue
            token = self._sampled_token(model_runner_output, rid)
            num_generation_tokens += 1
            seq.append_token_id(token)
            request.append_output_token_ids(token)
            if group.first_token_time is None:
                group.first_token_time = self.now
            maybe_stop_sequence(seq, group.sampling_params, max_model_len)
            finish_reason = None
            if seq.is_finished():
                self.scheduler.free_seq(seq)
                finish_reason = SequenceStatus.get_finished_reason(seq.status)
                request.stop_reason = seq.stop_reason
                group.finished_time = self.now
                finished_ids.add(rid)
            outputs.append(EngineCoreOutput(rid, [token], finish_reason, seq.stop_reason))
        self.scheduler.free_finished_seq_groups()
        for rid in finished_ids:
            self._retire(rid, _TO_REQUEST_STATUS[self.seq_groups[rid].seq.status])
        for group in outs.ignored_seq_groups:
            outputs.append(EngineCoreOutput(group.request_id, [], "length"))
            finished_ids.add(group.request_id)
        self.last_iteration = self.make_stats(self.now, num_prompt_tokens, num_generation_tokens, outs.preempted)
        self.stat_logger.record(num_prompt_tokens, num_generation_tokens)
        return {0: EngineCoreOutputs(outputs=outputs, finished_requests=finished_ids)}

    @staticmethod
    def _sampled_token(model_runner_output: ModelRunnerOutput, rid: str) -> int:
        idx = model_runner_output.req_id_to_index.get(rid)
        sampled = model_runner_output.sampled_token_ids[idx] if idx is not None else []
        if len(sampled) != 1:
            raise ValueError(f"request {rid!r} samples this step and needs exactly one sampled token "
                             f"(v0 has no speculative decoding); got {sampled!r}")
        return sampled[0]

    # -- stats ---------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_swapped(self) -> int:
        return len(self.scheduler.swapped)

    def get_num_free_gpu_blocks(self) -> int:
        return self.scheduler.block_manager.get_num_free_gpu_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.scheduler.block_manager.get_num_free_cpu_blocks()

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) like v1's; swapped requests are in neither."""
        return self.num_running, self.num_waiting

    def get_kv_cache_usage(self) -> float:
        return self.gpu_cache_usage

    @property
    def gpu_cache_usage(self) -> float:
        """`vllm:gpu_cache_usage_perc`: a fraction in [0, 1], as vLLM exports it."""
        return 1.0 - self.get_num_free_gpu_blocks() / self.cache_config.num_gpu_blocks

    @property
    def cpu_cache_usage(self) -> float:
        total = self.cache_config.num_cpu_blocks
        return 1.0 - self.get_num_free_cpu_blocks() / total if total > 0 else 0.0

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_cumulative_preemption

    def make_stats(self, now: float, num_prompt_tokens_iter: int = 0, num_generation_tokens_iter: int = 0,
                   num_preemption_iter: int = 0) -> V0Stats:
        return V0Stats(now, self.num_running, self.num_swapped, self.num_waiting, self.gpu_cache_usage,
                       self.cpu_cache_usage, num_prompt_tokens_iter, num_generation_tokens_iter, num_preemption_iter)

    def log_stats(self, now: float) -> str | None:
        """Log the periodic stats line if more than 5 s passed since the last one
        (counts are recorded by every `update_from_output`); returns the line."""
        return self.stat_logger.maybe_log(self.make_stats(now))

    def metrics(self) -> dict[str, float]:
        """The v0 gauges and counter under vLLM's metric names."""
        return {
            "vllm:num_requests_running": self.num_running,
            "vllm:num_requests_waiting": self.num_waiting,
            "vllm:num_requests_swapped": self.num_swapped,
            "vllm:gpu_cache_usage_perc": self.gpu_cache_usage,
            "vllm:cpu_cache_usage_perc": self.cpu_cache_usage,
            "vllm:num_preemptions_total": self.num_preemptions,
        }

    def counters(self) -> dict:
        s = self.scheduler
        return {
            "num_preemptions": s.num_cumulative_preemption,
            "num_preemptions_recompute": s.num_preemptions_by_mode[PreemptionMode.RECOMPUTE],
            "num_preemptions_swap": s.num_preemptions_by_mode[PreemptionMode.SWAP],
            "num_ignored_prompts": s.num_ignored_seq_groups,
            "starvation": s.starvation.to_dict(),
        }

    def get_counters(self) -> dict[str, int]:
        """`counters()` flattened to ints for reports: starvation counters get a
        `starvation_` prefix; the per-request blocker map is left out."""
        flat = {k: v for k, v in self.counters().items() if k != "starvation"}
        for k, v in self.scheduler.starvation.to_dict().items():
            if isinstance(v, int):
                flat[f"starvation_{k}"] = v
        return flat

    def diagnose(self) -> tuple[str, str]:
        return diagnose(self.scheduler.starvation)
