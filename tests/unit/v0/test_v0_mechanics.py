"""Swap and recompute, chunked prefill, the watermark, NEVER vs LATER, the
one-free-block decode heuristic, the preemption warning cadence, the policy
registry and configuration errors -- each checked by hand-driven steps whose
expected values were confirmed against vLLM 0.5.3.post1."""

import logging

import pytest

from cluster.spec import ClusterSpec
from engine.v0 import AllocStatus, BlockSpaceManagerV1, CacheConfig, Scheduler, SchedulerConfig, SequenceStatus
from engine.v0.policy import PolicyFactory
from engine.v0.testing import engine_step, ids, make_seq_group


def make_scheduler(
    num_gpu_blocks,
    block_size=4,
    num_cpu_blocks=0,
    max_model_len=256,
    max_num_batched_tokens=None,
    max_num_seqs=8,
    chunked=False,
    preemption_mode=None,
):
    return Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=chunked,
            preemption_mode=preemption_mode,
        ),
        CacheConfig(num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks, block_size=block_size),
    )


def free(s):
    return s.block_manager.get_num_free_gpu_blocks(), s.block_manager.get_num_free_cpu_blocks()


# -- swap ------------------------------------------------------------------------
def test_swap_out_moves_blocks_to_cpu_and_swap_in_comes_before_new_prefills():
    s = make_scheduler(4, num_cpu_blocks=8, preemption_mode="swap")
    s.add_seq_group(make_seq_group("a", 8, max_tokens=3, arrival_time=0, block_size=4))
    s.add_seq_group(make_seq_group("b", 8, max_tokens=30, arrival_time=1, block_size=4))
    engine_step(s)
    step = engine_step(s, now=1)
    assert step.preempted == ["b"]
    assert len(step.outputs.blocks_to_swap_out) == 2 and step.outputs.preempted == 1
    assert s.swapped[0].seq.status == SequenceStatus.SWAPPED
    assert free(s) == (1, 6)
    s.add_seq_group(make_seq_group("short", 2, arrival_time=2, block_size=4))
    step = engine_step(s, now=2)
    assert step.finished == ["a"] and free(s) == (4, 6)
    # Swapped first: b comes back (2 blocks + 1 for its next token) while short waits.
    step = engine_step(s, now=3)
    assert step.prefills == [] and step.decodes == ["b"]
    assert len(step.outputs.blocks_to_swap_in) == 2
    assert ids(s.waiting) == ["short"] and ids(s.swapped) == []
    assert free(s) == (1, 8)
    step = engine_step(s, now=4)
    assert step.prefills == [("short", 2)] and step.decodes == []  # a step is all prefills or all decodes


def test_swap_out_without_cpu_space_aborts_like_vllm():
    s = make_scheduler(4, num_cpu_blocks=1, preemption_mode="swap")
    s.add_seq_group(make_seq_group("a", 8, max_tokens=30, arrival_time=0, block_size=4))
    s.add_seq_group(make_seq_group("b", 8, max_tokens=30, arrival_time=1, block_size=4))
    engine_step(s)
    with pytest.raises(RuntimeError, match="Aborted due to the lack of CPU swap space"):
        engine_step(s, now=1)


def test_swap_in_that_can_never_fit_is_ignored_and_keeps_its_cpu_blocks():
    s = make_scheduler(4, num_cpu_blocks=8, preemption_mode="swap")
    s.add_seq_group(make_seq_group("b", 16, max_tokens=30, block_size=4))  # all 4 blocks
    engine_step(s)
    step = engine_step(s, now=1)  # b needs a free block to decode: preempts itself (swap)
    assert step.preempted == ["b"] and free(s) == (4, 4)
    step = engine_step(s, now=2)  # 4 blocks + 1 > 4 in total: NEVER
    assert step.ignored == ["b"]
    assert step.outputs.ignored_seq_groups[0].seq.status == SequenceStatus.FINISHED_IGNORED
    assert free(s) == (4, 4)  # vLLM never frees them
    assert not s.has_unfinished_seqs()


def test_default_preemption_mode_is_recompute_even_with_swap_space():
    s = make_scheduler(4, num_cpu_blocks=8)
    s.add_seq_group(make_seq_group("a", 8, max_tokens=30, arrival_time=0, block_size=4))
    s.add_seq_group(make_seq_group("b", 8, max_tokens=30, arrival_time=1, block_size=4))
    engine_step(s)
    step = engine_step(s, now=1)
    assert [g.request_id for g in step.outputs.preempted_seq_groups] == ["b"]
    assert step.outputs.blocks_to_swap_out == [] and free(s) == (1, 8)
    assert ids(s.waiting) == ["b"]


# -- chunked prefill --------------------------------------------------------------
def test_chunked_prefill_schedules_decodes_first_and_fills_the_budget_with_chunks():
    s = make_scheduler(40, chunked=True, max_num_batched_tokens=16, max_model_len=64)
    s.add_seq_group(make_seq_group("a", 4, max_tokens=10, arrival_time=0, block_size=4))
    engine_step(s)
    s.add_seq_group(make_seq_group("long", 40, max_tokens=2, arrival_time=1, block_size=4))
    metadata, outs = s.schedule(1)
    assert [(m.request_id, m.token_chunk_size, m.is_prompt, m.do_sample) for m in metadata] == [
        ("long", 15, True, False),
        ("a", 1, False, True),
    ]
    assert outs.num_prefill_groups == 1 and outs.num_batched_tokens == 16
    # The whole sequence is allocated at admission (10 blocks), not per chunk.
    assert free(s)[0] == 40 - 2 - 10


def test_chunked_prefill_runs_the_remaining_chunks_and_samples_on_the_last():
    s = make_scheduler(40, chunked=True, max_num_batched_tokens=16, max_model_len=64)
    s.add_seq_group(make_seq_group("a", 4, max_tokens=10, arrival_time=0, block_size=4))
    engine_step(s)
    s.add_seq_group(make_seq_group("long", 40, max_tokens=2, arrival_time=1, block_size=4))
    assert engine_step(s, 1).prefills == [("long", 15)]
    assert engine_step(s, 2).prefills == [("long", 15)]
    step = engine_step(s, 3)
    assert step.prefills == [("long", 10)] and step.decodes == ["a"]
    long = next(g for g in s.running if g.request_id == "long")
    assert long.seq.get_output_len() == 1 and not long.is_prefill()


def test_chunked_prefill_decodes_can_use_up_the_budget():
    s = make_scheduler(40, chunked=True, max_num_batched_tokens=2, max_num_seqs=2, max_model_len=64)
    s.add_seq_group(make_seq_group("a", 2, max_tokens=10, arrival_time=0, block_size=4))
    s.add_seq_group(make_seq_group("b", 8, max_tokens=10, arrival_time=1, block_size=4))
    assert engine_step(s).prefills == [("a", 2)]
    step = engine_step(s, 1)
    assert step.decodes == ["a"] and step.prefills == [("b", 1)]


# -- watermark, NEVER vs LATER ------------------------------------------------------
@pytest.mark.parametrize("num_gpu_blocks,watermark_blocks", [(99, 0), (100, 1), (250, 2)])
def test_watermark_is_one_percent_of_gpu_blocks_truncated(num_gpu_blocks, watermark_blocks):
    assert BlockSpaceManagerV1(4, num_gpu_blocks, 0).watermark_blocks == watermark_blocks


def test_watermark_applies_to_admission_not_to_decode_appends(caplog):
    s = make_scheduler(100, max_model_len=400)  # watermark: 1 block
    s.add_seq_group(make_seq_group("a", 396, max_tokens=5, arrival_time=0, block_size=4))  # 99 blocks
    s.add_seq_group(make_seq_group("b", 400, max_tokens=1, arrival_time=1, block_size=4))  # 100 blocks
    s.add_seq_group(make_seq_group("c", 4, max_tokens=1, arrival_time=2, block_size=4))  # 1 block
    bm = s.block_manager
    assert [bm.can_allocate(g) for g in s.waiting] == [AllocStatus.OK, AllocStatus.NEVER, AllocStatus.OK]
    with caplog.at_level(logging.WARNING, logger="vllm.v0"):
        step = engine_step(s)
    # b can NEVER fit (100 - 100 < 1): ignored, the pass goes on; c: 1 - 1 < 1 -> LATER.
    assert step.prefills == [("a", 396)] and step.ignored == ["b"]
    assert ids(s.waiting) == ["c"]
    assert [r.getMessage() for r in caplog.records] == [
        "Input prompt (400 tokens) is too long and exceeds the capacity of block_manager"
    ]
    step = engine_step(s, 1)  # a's 397th token needs block 100: the watermark does not stop it
    assert step.decodes == ["a"] and free(s)[0] == 0


def test_never_is_dropped_but_later_blocks_the_queue():
    s = make_scheduler(4)
    s.add_seq_group(make_seq_group("huge", 20, block_size=4))  # 5 blocks > 4: NEVER
    s.add_seq_group(make_seq_group("fits", 12, block_size=4))  # 3 blocks
    s.add_seq_group(make_seq_group("later", 8, block_size=4))  # 2 blocks, 1 left: LATER
    s.add_seq_group(make_seq_group("tiny", 1, block_size=4))
    step = engine_step(s)
    assert step.ignored == ["huge"]
    assert step.prefills == [("fits", 12)]
    assert ids(s.waiting) == ["later", "tiny"]


# -- the decode heuristic and the preemption warning ----------------------------------
def test_decode_needs_a_free_block_even_when_its_last_block_has_room():
    s = make_scheduler(3)
    s.add_seq_group(make_seq_group("a", 5, max_tokens=20, arrival_time=0, block_size=4))  # 2 blocks, 3 slots left
    s.add_seq_group(make_seq_group("b", 1, max_tokens=20, arrival_time=1, block_size=4))  # 1 block
    engine_step(s)
    assert free(s) == (0, 0)
    step = engine_step(s, 1)
    assert step.preempted == ["b"] and step.decodes == ["a"]


def test_preemption_warning_is_logged_for_the_1st_51st_and_101st_preemption(caplog):
    s = make_scheduler(2)
    # Each request fills the pool, so it preempts itself at every decode: twice
    # before its third token (two recomputes, each sampling one token).
    for k in range(60):
        s.add_seq_group(make_seq_group(f"q{k}", 5, max_tokens=3, arrival_time=k, block_size=4))
    with caplog.at_level(logging.WARNING, logger="vllm.v0"):
        for i in range(1000):
            if not s.has_unfinished_seqs():
                break
            engine_step(s, i)
    assert s.num_cumulative_preemption == 120
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 3
    assert msgs[0] == (
        "Sequence group q0 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
        "This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to "
        "provide more KV cache memory. total_num_cumulative_preemption=1"
    )
    assert [m.rsplit("=", 1)[1] for m in msgs] == ["1", "51", "101"]


# -- policy and configuration -----------------------------------------------------------
def test_the_only_policy_is_fcfs_sorting_by_arrival_stably():
    assert list(PolicyFactory._POLICY_REGISTRY) == ["fcfs"]
    with pytest.raises(ValueError, match=r"policy_name='priority' is invalid; allowed: \['fcfs'\]"):
        PolicyFactory.get_policy("priority")
    groups = [make_seq_group(r, 1, arrival_time=t) for r, t in (("x", 2.0), ("y", 1.0), ("z", 2.0), ("w", 0.5))]
    assert ids(PolicyFactory.get_policy("fcfs").sort_by_priority(10.0, groups)) == ["w", "y", "x", "z"]


def test_scheduler_config_keeps_vllms_own_rules():
    with pytest.raises(ValueError, match=r"must be >= max_num_seqs"):
        SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=8, enable_chunked_prefill=True)


@pytest.mark.parametrize(
    "engine,match",
    [
        ({"max_num_seqs": 0}, r"decode.engine.max_num_seqs\n  Input should be greater than or equal to 1"),
        (
            {"preemption_mode": "evict"},
            r"decode.engine.preemption_mode\n  Input should be 'auto', 'recompute' or 'swap'",
        ),
        ({"max_num_batched_tokens": 4, "max_num_seqs": 8}, r"must be >= max_num_seqs"),
    ],
)
def test_bad_v0_settings_are_refused_once_by_the_schema_naming_the_field(engine, match):
    """A v0 node's values are checked by the scenario schema (bounds from the
    settings' declarations) and, through it, by vLLM 0.5.3's own rules."""
    with pytest.raises(ValueError, match=match):
        ClusterSpec.model_validate({"prefill": {"count": 0}, "decode": {"engine": {"engine": "v0", **engine}}})


def test_scheduler_config_defaults_follow_vllm():
    assert SchedulerConfig(max_model_len=4096).max_num_batched_tokens == 4096
    assert SchedulerConfig(max_model_len=1024).max_num_batched_tokens == 2048
    assert SchedulerConfig(enable_chunked_prefill=True).max_num_batched_tokens == 512


@pytest.mark.parametrize(
    "engine,match",
    [
        ({"num_gpu_blocks": 1}, r"decode.engine.num_gpu_blocks\n  Value error, allowed: an int in \[2, 1000000\]"),
        ({"num_cpu_blocks": -1}, r"decode.engine.num_cpu_blocks\n  Input should be greater than or equal to 0"),
    ],
)
def test_bad_v0_pool_sizes_are_refused_by_the_schema_naming_the_field(engine, match):
    with pytest.raises(ValueError, match=match):
        ClusterSpec.model_validate({"prefill": {"count": 0}, "decode": {"engine": {"engine": "v0", **engine}}})


def test_swap_space_in_gib_converts_to_cpu_blocks():
    # 4 GiB of 16-token blocks at 128 KiB/token (Llama-3-8B fp16) = 2 MiB per block.
    assert CacheConfig.num_cpu_blocks_for_swap_space(4, 16 * 131072) == 2048
