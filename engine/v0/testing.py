"""Helpers to drive the v0 `Scheduler` by hand, the way vLLM's own scheduler
tests do: build groups, run one engine iteration with a fake model.

`engine_step` is LLMEngine's per-step bookkeeping in 0.5.3.post1 minus the model
(the same loop as tools/oracle/kit/v0_scheduler_kit.py's `step`): schedule, advance
every scheduled group's computed tokens, append one token to groups that
sample, stop-check, free finished sequences and groups.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.request import SamplingParams
from engine.v0.scheduler import Scheduler
from engine.v0.scheduler_outputs import SchedulerOutputs
from engine.v0.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.v0.stop_checker import maybe_stop_sequence

_seq_ids = itertools.count()


def make_seq_group(
    request_id: str,
    prompt_len: int,
    max_tokens: int = 16,
    arrival_time: float = 0.0,
    block_size: int = 16,
    ignore_eos: bool = True,
) -> SequenceGroup:
    seq = Sequence(next(_seq_ids), list(range(prompt_len)), block_size)
    return SequenceGroup(request_id, seq, arrival_time, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))


@dataclass
class StepResult:
    outputs: SchedulerOutputs
    prefills: list[tuple[str, int]] = field(default_factory=list)
    decodes: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)

    @property
    def ignored(self) -> list[str]:
        return [g.request_id for g in self.outputs.ignored_seq_groups]

    @property
    def preempted(self) -> list[str]:
        return [g.request_id for g in self.outputs.preempted_seq_groups + self.outputs.swapped_out_seq_groups]


def engine_step(sched: Scheduler, now: float = 0.0, token_id: int = 7) -> StepResult:
    metadata, outs = sched.schedule(now)
    result = StepResult(outs)
    max_model_len = sched.scheduler_config.max_model_len
    for meta, scheduled in zip(metadata, outs.scheduled_seq_groups):
        group = scheduled.seq_group
        if meta.is_prompt:
            result.prefills.append((group.request_id, scheduled.token_chunk_size))
        else:
            result.decodes.append(group.request_id)
        group.update_num_computed_tokens(scheduled.token_chunk_size)
        if not meta.do_sample:
            continue
        for seq in group.get_seqs(status=SequenceStatus.RUNNING):
            seq.append_token_id(token_id)
            maybe_stop_sequence(seq, group.sampling_params, max_model_len)
            if seq.is_finished():
                sched.free_seq(seq)
                result.finished.append(group.request_id)
    sched.free_finished_seq_groups()
    return result


def ids(queue: Iterable[SequenceGroup]) -> list[str]:
    return [g.request_id for g in queue]
