"""The v1-shaped adapter: requests in, `SchedulerOutput` out, model outputs
back, `EngineCoreOutputs` out -- the engine loop's view of a v0 node."""

import logging

import pytest

from engine.outputs import ModelRunnerOutput
from engine.request import Request, RequestStatus, SamplingParams
from engine.v0 import CacheConfig, SchedulerConfig, V0SchedulerAdapter


def make_adapter(num_gpu_blocks=40, block_size=4, num_cpu_blocks=0, **sched):
    cfg = {"max_num_seqs": 8, "max_model_len": 64, **sched}
    return V0SchedulerAdapter(
        SchedulerConfig(**cfg),
        CacheConfig(num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks, block_size=block_size),
        log_startup=False,
    )


def req(rid, prompt_len, max_tokens=4, arrival=0.0, **sp):
    params = {"ignore_eos": True, **sp}
    return Request(
        rid,
        list(range(prompt_len)),
        SamplingParams(max_tokens=max_tokens, **params),
        eos_token_id=sp.pop("eos", None),
        arrival_time=arrival,
    )


def runner_output(so, tokens):
    """tokens: {req_id: [ids]}; requests not listed sample []."""
    rids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(rids, {r: i for i, r in enumerate(rids)}, [tokens.get(r, []) for r in rids])


def test_a_step_reports_tokens_new_requests_and_outputs():
    a = make_adapter()
    a.add_request(req("x", 10, max_tokens=2, arrival=0))
    a.add_request(req("y", 6, max_tokens=3, arrival=1))
    so = a.schedule(now=0.0)
    assert so.num_scheduled_tokens == {"x": 10, "y": 6}
    assert so.total_num_scheduled_tokens == 16
    assert [(n.req_id, n.prompt_len, n.num_computed_tokens) for n in so.scheduled_new_reqs] == [
        ("x", 10, 0),
        ("y", 6, 0),
    ]
    assert so.finished_req_ids == set() and so.preempted_req_ids == set()
    out = a.update_from_output(so, runner_output(so, {"x": [11], "y": [12]}))[0]
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in out.outputs] == [
        ("x", [11], None),
        ("y", [12], None),
    ]
    so = a.schedule(now=1.0)
    assert so.num_scheduled_tokens == {"x": 1, "y": 1}
    assert so.scheduled_cached_reqs.req_ids == ["x", "y"]
    assert so.scheduled_cached_reqs.num_computed_tokens == [10, 6]
    out = a.update_from_output(so, runner_output(so, {"x": [13], "y": [14]}))[0]
    assert [(o.request_id, o.finish_reason) for o in out.outputs] == [("x", "length"), ("y", None)]
    assert out.finished_requests == {"x"}
    assert a.get_num_unfinished_requests() == 1
    so = a.schedule(now=2.0)
    assert so.finished_req_ids == {"x"}  # reported once, in the next step


def test_ignored_prompt_is_finished_in_the_same_step_with_reason_length():
    a = make_adapter()
    x = req("big", 65)
    a.add_request(x)
    a.add_request(req("ok", 4))
    so = a.schedule()
    assert so.finished_req_ids == {"big"}
    assert so.num_scheduled_tokens == {"ok": 4}
    assert x.status == RequestStatus.FINISHED_IGNORED
    out = a.update_from_output(so, runner_output(so, {"ok": [1]}))[0]
    assert ("big", [], "length") in [(o.request_id, o.new_token_ids, o.finish_reason) for o in out.outputs]
    assert "big" in out.finished_requests
    assert a.counters()["num_ignored_prompts"] == 1


def test_prefill_chunks_sample_nothing_and_flag_is_prefill_chunk():
    a = make_adapter(enable_chunked_prefill=True, max_num_batched_tokens=16)
    x = req("x", 40, max_tokens=2)
    a.add_request(x)
    so = a.schedule()
    assert so.num_scheduled_tokens == {"x": 16} and x.is_prefill_chunk
    # A token sent for a non-final chunk is discarded, as v1 does.
    out = a.update_from_output(so, runner_output(so, {"x": [99]}))[0]
    assert out.outputs == [] and x.output_token_ids == [] and x.num_computed_tokens == 16
    so = a.schedule()
    a.update_from_output(so, runner_output(so, {}))
    so = a.schedule()
    assert so.num_scheduled_tokens == {"x": 8} and not x.is_prefill_chunk
    assert so.scheduled_cached_reqs.num_computed_tokens == [32]
    out = a.update_from_output(so, runner_output(so, {"x": [5]}))[0]
    assert [(o.request_id, o.new_token_ids) for o in out.outputs] == [("x", [5])]


def test_stop_checks_follow_vllm_053_order():
    a = make_adapter()
    a.add_request(Request("eos", [1, 2], SamplingParams(max_tokens=9, min_tokens=2), eos_token_id=0))
    a.add_request(req("stop", 2, max_tokens=9, stop_token_ids=[42]))
    a.add_request(req("cap", 64, max_tokens=9))  # 64 + 1 > max_model_len 64: capped after one token
    so = a.schedule()
    out = a.update_from_output(so, runner_output(so, {"eos": [0], "stop": [42], "cap": [3]}))[0]
    reasons = {o.request_id: (o.finish_reason, o.stop_reason) for o in out.outputs}
    # eos: below min_tokens nothing stops it.
    assert reasons == {"eos": (None, None), "stop": ("stop", 42), "cap": ("length", None)}
    so = a.schedule()
    out = a.update_from_output(so, runner_output(so, {"eos": [0]}))[0]
    assert [(o.request_id, o.finish_reason) for o in out.outputs] == [("eos", "stop")]


def test_preemption_is_reported_and_mirrored_on_the_request():
    a = make_adapter(num_gpu_blocks=3)
    x, y = req("x", 5, max_tokens=20, arrival=0), req("y", 1, max_tokens=20, arrival=1)
    a.add_request(x)
    a.add_request(y)
    so = a.schedule()
    a.update_from_output(so, runner_output(so, {"x": [1], "y": [1]}))
    so = a.schedule()
    assert so.preempted_req_ids == {"y"} and so.num_scheduled_tokens == {"x": 1}
    assert y.status == RequestStatus.PREEMPTED and y.num_preemptions == 1 and y.num_computed_tokens == 0
    assert a.num_preemptions == 1 and a.metrics()["vllm:num_preemptions_total"] == 1


def test_finish_requests_frees_blocks_and_reports_the_ids_next_step():
    a = make_adapter()
    x = req("x", 8)
    a.add_request(x)
    so = a.schedule()
    a.update_from_output(so, runner_output(so, {"x": [1]}))
    assert a.get_num_free_gpu_blocks() == 38  # 9 tokens still fit in 2 blocks
    a.finish_requests("x", RequestStatus.FINISHED_ABORTED)
    assert x.status == RequestStatus.FINISHED_ABORTED and a.get_num_free_gpu_blocks() == 40
    assert a.has_requests() and a.get_num_unfinished_requests() == 0
    so = a.schedule()
    assert so.finished_req_ids == {"x"} and so.num_scheduled_tokens == {}
    a.update_from_output(so, ModelRunnerOutput.empty())
    assert not a.has_requests()
    a.finish_requests(["x", "unknown"], RequestStatus.FINISHED_ABORTED)  # ignored, as in v1
    with pytest.raises(ValueError, match="finished_status=<RequestStatus.RUNNING: 3> is invalid"):
        a.finish_requests("x", RequestStatus.RUNNING)


def test_a_request_aborted_between_schedule_and_update_is_skipped():
    a = make_adapter()
    a.add_request(req("x", 8))
    a.add_request(req("y", 8))
    so = a.schedule()
    a.finish_requests("x", RequestStatus.FINISHED_ABORTED)
    out = a.update_from_output(so, runner_output(so, {"x": [1], "y": [2]}))[0]
    assert [o.request_id for o in out.outputs] == ["y"]


def test_depth_one_is_enforced_and_bad_outputs_are_named():
    a = make_adapter()
    a.add_request(req("x", 8))
    so = a.schedule()
    with pytest.raises(RuntimeError, match="depth 1"):
        a.schedule()
    with pytest.raises(ValueError, match=r"request 'x' samples this step and needs exactly one sampled token"):
        a.update_from_output(so, runner_output(so, {}))
    b = make_adapter()
    b.add_request(req("x", 8))
    with pytest.raises(RuntimeError, match="SchedulerOutput of the last schedule"):
        b.update_from_output(so, ModelRunnerOutput.empty())
    with pytest.raises(ValueError, match="request 'x' is already in the v0 scheduler"):
        b.add_request(req("x", 8))


def test_metrics_use_vllm_names_and_fractions():
    a = make_adapter(num_gpu_blocks=10, num_cpu_blocks=4)
    a.add_request(req("x", 8))
    a.add_request(req("y", 100))  # ignored
    a.add_request(req("z", 40))  # 10 blocks: waits (LATER)
    so = a.schedule()
    a.update_from_output(so, runner_output(so, {"x": [1]}))
    assert a.metrics() == {
        "vllm:num_requests_running": 1,
        "vllm:num_requests_waiting": 1,
        "vllm:num_requests_swapped": 0,
        "vllm:gpu_cache_usage_perc": pytest.approx(0.2),
        "vllm:cpu_cache_usage_perc": 0.0,
        "vllm:num_preemptions_total": 0,
    }


def test_startup_line_and_periodic_stats_line(caplog):
    caplog.set_level(logging.INFO, logger="vllm.v0")
    a = V0SchedulerAdapter(
        SchedulerConfig(max_num_seqs=8, max_model_len=64),
        CacheConfig(num_gpu_blocks=10, num_cpu_blocks=4, block_size=4),
        start_time=100.0,
    )
    assert [r.getMessage() for r in caplog.records] == ["# GPU blocks: 10, # CPU blocks: 4"]
    assert caplog.records[0].name == "vllm.v0"
    a.add_request(req("x", 8, max_tokens=9))
    so = a.schedule(now=100.0)
    a.update_from_output(so, runner_output(so, {"x": [1]}))
    assert a.log_stats(now=104.0) is None  # not more than 5 s yet
    so = a.schedule(now=106.0)
    a.update_from_output(so, runner_output(so, {"x": [2]}))
    line = a.log_stats(now=110.0)
    # 8 prompt tokens and 1 + 1 generated tokens over 10 s; x holds 3 of 10 blocks.
    assert line == (
        "Avg prompt throughput: 0.8 tokens/s, Avg generation throughput: 0.2 tokens/s, Running: 1 reqs, "
        "Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 30.0%, CPU KV cache usage: 0.0%."
    )
    assert caplog.records[-1].getMessage() == line
