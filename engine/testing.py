"""Helpers to build and drive a scheduler by hand, with the same signatures as
vLLM's test utilities (`tests/v1/core/utils.py`) and the oracle kit, so a
script written against vLLM's scheduler ports with thin changes."""

from __future__ import annotations

from typing import Literal

from .config import (
    CacheConfig,
    KVRole,
    KVTransferConfig,
    ParallelConfig,
    PreemptionGuard,
    SchedulerConfig,
    SchedulingPolicy,
    VllmConfig,
)
from .kv_connector.pd_connector import PDConnector
from .outputs import ModelRunnerOutput, SchedulerOutput
from .request import Request, SamplingParams
from .scheduler import Scheduler, create_scheduler_for

EOS_TOKEN_ID = 50256


def create_scheduler(
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    enable_chunked_prefill: bool = True,
    long_prefill_token_threshold: int = 0,
    num_blocks: int = 10000,
    block_size: int = 16,
    max_model_len: int | None = None,
    async_scheduling: bool = False,
    policy: SchedulingPolicy = "fcfs",
    kv_role: KVRole | None = None,
    defer_block_free: bool | None = None,
    preemption_guard: PreemptionGuard = "fixed",
    pipeline_parallel_size: int = 1,
    scheduler_reserve_full_isl: bool = True,
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail",
    enable_prefix_caching: bool = False,
) -> Scheduler:
    if max_model_len is None:
        max_model_len = max_num_batched_tokens
    config = VllmConfig(
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            policy=policy,
            async_scheduling=async_scheduling,
            scheduler_reserve_full_isl=scheduler_reserve_full_isl,
            preemption_guard=preemption_guard,
            defer_block_free=defer_block_free,
        ),
        cache_config=CacheConfig(
            num_gpu_blocks=num_blocks, block_size=block_size, enable_prefix_caching=enable_prefix_caching
        ),
        parallel_config=ParallelConfig(pipeline_parallel_size=pipeline_parallel_size),
        kv_transfer_config=(
            KVTransferConfig(kv_role=kv_role, kv_load_failure_policy=kv_load_failure_policy) if kv_role else None
        ),
    )
    ktc = config.kv_transfer_config  # (set iff `kv_role`)
    connector = PDConnector(ktc) if ktc is not None else None
    return create_scheduler_for(config, connector)


def create_requests(
    num_requests: int,
    num_tokens: int = 10,
    max_tokens: int = 16,
    stop_token_ids: list[int] | None = None,
    req_ids: list[str] | None = None,
    priorities: list[int] | None = None,
    arrival_times: list[float] | None = None,
    ignore_eos: bool = False,
    same_prompt: bool = False,
    prompt_token_ids: list[list[int]] | None = None,
) -> list[Request]:
    """`prompt_token_ids` (one list per request) overrides `num_tokens` and
    `same_prompt`, as in the oracle kit: use it for prefix-caching scenarios."""
    if req_ids is not None and len(req_ids) != num_requests:
        raise ValueError(f"req_ids has {len(req_ids)} ids for {num_requests} requests")
    if prompt_token_ids is not None and len(prompt_token_ids) != num_requests:
        raise ValueError(f"prompt_token_ids has {len(prompt_token_ids)} prompts for {num_requests} requests")
    ids = req_ids or [str(i) for i in range(num_requests)]
    out = []
    for i in range(num_requests):
        params = SamplingParams(max_tokens=max_tokens, stop_token_ids=list(stop_token_ids or []), ignore_eos=ignore_eos)
        if prompt_token_ids is not None:
            prompt = list(prompt_token_ids[i])
        else:
            prompt = [0] * num_tokens if same_prompt else [i] * num_tokens
        out.append(
            Request(
                ids[i],
                prompt,
                params,
                eos_token_id=EOS_TOKEN_ID,
                arrival_time=arrival_times[i] if arrival_times is not None else float(i),
                priority=priorities[i] if priorities is not None else 0,
            )
        )
    return out


def make_model_runner_output(scheduler_output: SchedulerOutput, token_id: int = 0) -> ModelRunnerOutput:
    """One sampled token per scheduled request (as vLLM's fence tests do)."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[token_id] for _ in req_ids],
    )
