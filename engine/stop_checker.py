"""`check_stop` in vLLM 0.33.0's order (`vllm/v1/core/sched/utils.py`):
EOS, then stop tokens, then the length cap.

`min_tokens`: vLLM's sampler masks EOS and the stop tokens until a request
has `min_tokens` outputs, so neither can end it earlier. The simulator's
sampler draws tokens by position and masks nothing, so the same rule is
applied here: below `min_tokens`, an EOS or stop token does not stop the
request (it stays in the output; the length cap still applies)."""

from __future__ import annotations

from .request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    outputs = request._output_token_ids
    last_token_id = outputs[-1]
    if len(outputs) < request.sampling_params.min_tokens:
        if request.num_tokens >= max_model_len or len(outputs) >= request.max_tokens:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False
    if last_token_id == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    stop_ids = request.sampling_params.stop_token_ids
    if stop_ids and last_token_id in stop_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last_token_id
        return True
    if request.num_tokens >= max_model_len or len(outputs) >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
