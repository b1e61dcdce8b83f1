"""vLLM 0.5.3.post1's `StopChecker.maybe_stop_sequence`, token part only
(`vllm/engine/output_processor/stop_checker.py`; stop strings need a
tokenizer and are not modelled).

Order: below `min_tokens` nothing stops (not even the length caps); then EOS
(unless `ignore_eos`), stop token ids, length over `max_model_len`, and
`max_tokens`. Note `>` for the model length: v1 uses `>=`.
"""

from __future__ import annotations

from engine.request import SamplingParams
from engine.v0.sequence import Sequence, SequenceStatus


def maybe_stop_sequence(seq: Sequence, sampling_params: SamplingParams, max_model_len: int) -> None:
    """Sets `seq.status` (and `stop_reason`) when the last appended token ends it."""
    # Runs for every sampled token: plain attribute reads instead of accessors.
    output_len = len(seq.output_token_ids)
    if output_len < sampling_params.min_tokens:
        return
    last_token_id = seq.output_token_ids[-1] if output_len else seq.prompt_token_ids[-1]
    if not sampling_params.ignore_eos and seq.eos_token_id is not None and last_token_id == seq.eos_token_id:
        seq.status = SequenceStatus.FINISHED_STOPPED
        return
    if sampling_params.stop_token_ids and last_token_id in sampling_params.stop_token_ids:
        seq.status = SequenceStatus.FINISHED_STOPPED
        seq.stop_reason = last_token_id
        return
    if seq._len > max_model_len:
        seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
        return
    if output_len == sampling_params.max_tokens:
        seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
