"""A node running vLLM 0.5.3's v0 scheduler (`engine: v0`) inside the simulator:
the engine loop, the step records, swap through the shadow KV store, the
empty steps only v0 has, its settings' errors, and the periodic log line."""

import logging

import pytest

from cluster.inproc import InProcCluster, run_inproc
from cluster.spec import ClusterSpec
from engine.config import CacheConfig as V1CacheConfig
from engine.config import SchedulerConfig as V1SchedulerConfig
from engine.engine_core import EngineScheduler
from engine.node_core import NodeCore, NodeSpec
from engine.records import WorkloadRequest
from engine.request import Request, SamplingParams
from engine.scheduler import Scheduler
from engine.v0 import V0SchedulerAdapter


def v0_spec(blocks=64, cpu_blocks=0, mode="auto", chunked=False, **engine):
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": 0},
            "decode": {
                "count": 1,
                "engine": {
                    "engine": "v0",
                    "num_gpu_blocks": blocks,
                    "block_size": 16,
                    "max_num_seqs": 32,
                    "max_num_batched_tokens": 1024,
                    "max_model_len": 1024,
                    "enable_chunked_prefill": chunked,
                    "num_cpu_blocks": cpu_blocks,
                    "preemption_mode": mode,
                    **engine,
                },
            },
            "cost_model": "synthetic-8b",
        }
    )


def burst(n, prompt=100, out=60, gap=0.01):
    return [WorkloadRequest(f"r{i:03d}", i * gap, prompt + 7 * (i % 5), out) for i in range(n)]


def test_a_v0_node_serves_a_workload_with_clean_invariants_and_v0_step_records():
    result = run_inproc(v0_spec(), burst(30), debug_invariants=True)
    assert result.invariant_errors == [] and result.violations == []
    assert [r.finish_reason for r in result.requests] == ["length"] * 30
    assert all(len(r.output_token_ids) == 60 for r in result.requests)
    c = result.node_counters["decode-0"]
    assert c["num_preemptions"] > 0 and c["num_preemptions"] == c["num_preemptions_recompute"]
    assert c["num_ignored_prompts"] == 0 and c["kv_corruptions_detected"] == 0
    assert c["v0_num_waiting_final"] == c["v0_num_running_final"] == c["v0_num_swapped_final"] == 0
    assert c["v0_num_steps"] == len(result.steps) and c["v0_gpu_blocks_used_peak"] == 64
    # v0 has no null block: the whole pool is usable, and a step is all prefills or all decodes.
    assert {s.num_total_blocks for s in result.steps} == {64}
    assert all(s.num_prefill_tokens == 0 or s.num_decode_tokens == 0 for s in result.steps)
    assert {s.batches_in_flight for s in result.steps} == {1}
    assert result.steps[-1].num_preemptions_total == c["num_preemptions"]
    # Preemption counts reach the requests that were preempted.
    assert sum(r.num_preemptions for r in result.requests) == c["num_preemptions"]


def test_same_seed_same_run_bit_for_bit():
    def once():
        r = run_inproc(v0_spec(cpu_blocks=128, mode="swap"), burst(30), seed=2)
        return [(x.request_id, x.token_times, x.output_token_ids) for x in r.requests], [s.to_dict() for s in r.steps]

    assert once() == once()


def _swap_run(copy_swapped_blocks: bool):
    cluster = InProcCluster(v0_spec(cpu_blocks=128, mode="swap"), seed=0)
    if not copy_swapped_blocks:
        cluster.nodes["decode-0"].core.runner.cpu_shadow = None
    cluster.submit(burst(30))
    return cluster.run()


def test_swapped_out_kv_comes_back_intact_through_the_cpu_shadow():
    result = _swap_run(copy_swapped_blocks=True)
    c = result.node_counters["decode-0"]
    assert c["num_preemptions_swap"] > 0 and c["v0_cpu_blocks_used_peak"] > 0
    assert c["shadow_read_missing"] == 0 and c["kv_corruptions_detected"] == 0
    assert result.invariant_errors == []


def test_without_the_swap_copy_the_shadow_store_sees_the_missing_kv():
    c = _swap_run(copy_swapped_blocks=False).node_counters["decode-0"]
    assert c["num_preemptions_swap"] > 0 and c["shadow_read_missing"] > 0


def _hand_driven_node(blocks, max_model_len=64, block_size=4):
    spec = NodeSpec(
        "v0-node",
        None,
        V1SchedulerConfig(
            max_num_seqs=4,
            max_num_batched_tokens=max_model_len,
            max_model_len=max_model_len,
            enable_chunked_prefill=False,
        ),
        V1CacheConfig(num_gpu_blocks=blocks, block_size=block_size),
        engine="v0",
    )
    return NodeCore(spec)


def _step(core, now):
    plan = core.schedule_step(now)
    if plan is None:
        return None
    return core.process_oldest(core.finish_step(plan, now))


def test_an_ignored_prompt_alone_still_gets_its_step_and_its_output():
    core = _hand_driven_node(blocks=32)
    core.add_request(Request("long", range(65), SamplingParams(max_tokens=4)))
    outputs = _step(core, 0.0)  # schedules no token, but must not be dropped
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outputs] == [("long", [], "length")]
    assert core.step_records[-1].num_scheduled_tokens == 0
    assert not core.has_work()


def test_a_request_that_preempts_itself_is_recomputed_and_then_ignored_not_stranded():
    # 4 blocks of 4 tokens: the 16-token prompt fills the pool; its first decode
    # needs a free block, so it preempts itself (an empty step the loop must run);
    # recomputing 17 tokens needs 5 blocks, more than the pool: ignored.
    core = _hand_driven_node(blocks=4)
    core.add_request(Request("x", range(16), SamplingParams(max_tokens=8)))
    first = _step(core, 0.0)
    assert [len(o.new_token_ids) for o in first] == [1]
    assert _step(core, 1.0) == []
    assert core.step_records[-1].num_preemptions_total == 1
    last = _step(core, 2.0)
    assert [(o.request_id, o.new_token_ids, o.finish_reason, o.num_preemptions) for o in last] == [
        ("x", [], "length", 1)
    ]
    assert core.scheduler.counters()["num_ignored_prompts"] == 1 and not core.has_work()
    core.check_block_conservation()


def test_the_periodic_stats_line_is_logged_on_the_engine_clock(caplog):
    caplog.set_level(logging.INFO, logger="vllm.v0")
    run_inproc(v0_spec(), [WorkloadRequest(f"r{i}", i * 1.0, 50, 400) for i in range(12)])
    lines = [r.getMessage() for r in caplog.records if "Pending:" in r.getMessage()]
    assert lines and all(line.startswith("Avg prompt throughput: ") for line in lines)
    assert caplog.records[0].getMessage() == "# GPU blocks: 64, # CPU blocks: 0"


@pytest.mark.parametrize(
    "raw,match",
    [
        ({"decode": {"engine": {"engine": "v0"}}}, r"decode.engine.engine='v0' is invalid in a disaggregated topology"),
        (
            {"prefill": {"count": 0}, "decode": {"pp_size": 2, "engine": {"engine": "v0"}}},
            r"decode.pp_size=2 is invalid with engine v0",
        ),
        (
            {"prefill": {"count": 0}, "decode": {"engine": {"engine": "v0", "async_scheduling": True}}},
            r"async_scheduling=True is a v1 setting; allowed with engine v0: False",
        ),
        (
            {"prefill": {"count": 0}, "decode": {"engine": {"num_cpu_blocks": 8}}},
            r"are v0 settings; allowed with engine v1",
        ),
        (
            {"prefill": {"count": 0}, "decode": {"engine": {"engine": "v0", "preemption_mode": "swap"}}},
            r"preemption_mode='swap' with num_cpu_blocks=0 is invalid",
        ),
        (
            {
                "prefill": {"count": 0},
                "decode": {
                    "engine": {
                        "engine": "v0",
                        "enable_chunked_prefill": False,
                        "max_num_batched_tokens": 512,
                        "max_model_len": 1024,
                    }
                },
            },
            r"max_num_batched_tokens \(512\) is smaller than max_model_len \(1024\)",
        ),
    ],
)
def test_bad_v0_settings_fail_at_load_naming_the_setting(raw, match):
    with pytest.raises(ValueError, match=match):
        ClusterSpec.model_validate(raw)


def test_a_v0_node_spec_with_a_kv_role_is_refused():
    spec = NodeSpec("p", "kv_producer", V1SchedulerConfig(max_num_batched_tokens=2048, max_model_len=2048), engine="v0")
    with pytest.raises(ValueError, match=r"node 'p': kv_role='kv_producer' is invalid for engine v0"):
        NodeCore(spec)
    with pytest.raises(ValueError, match=r"decode.engine.engine\n  Input should be 'v1' or 'v0'"):
        ClusterSpec.model_validate({"decode": {"engine": {"engine": "v2"}}})


def test_both_schedulers_offer_the_engine_loops_protocol():
    wanted = {n for n in vars(EngineScheduler) if not n.startswith("_")}
    assert {"advance_clock", "step_needs_update", "get_preemption_totals"} <= wanted
    for cls in (Scheduler, V0SchedulerAdapter):
        assert all(callable(getattr(cls, n, None)) for n in wanted), cls
