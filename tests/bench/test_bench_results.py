"""Results JSON: keys, types, round trip, step trace, validation errors."""

import json

import pytest

from bench.results import (
    NODE_COUNTER_KEYS,
    ResultsError,
    aggregate_counters,
    build_result,
    load_result,
    load_results,
    load_steps_for,
    read_step_trace,
    write_run,
)
from engine.records import RequestRecord, StepRecord


def records():
    return [
        RequestRecord(
            "a",
            0.0,
            10,
            3,
            first_scheduled_time=0.1,
            token_times=[0.5, 0.7, 1.0],
            finish_time=1.0,
            finish_reason="length",
            num_preemptions=1,
        ),
        RequestRecord("b", 0.2, 30, 3, token_times=[0.9], finish_time=0.9, finish_reason="stop"),
        RequestRecord("c", 0.4, 50, 3, finish_reason="abort", finish_time=0.6),
    ]


def steps():
    return [
        StepRecord(
            node="decode-0",
            time=0.1 * i,
            step_index=i,
            batch_size=2,
            num_scheduled_tokens=20,
            num_prefill_tokens=18,
            num_decode_tokens=2,
            num_running=2,
            num_waiting=1,
            num_waiting_for_remote_kvs=0,
            num_free_blocks=6 - i,
            num_deferred_blocks=i % 2,
            num_total_blocks=8,
            batches_in_flight=2,
            num_preemptions_total=i,
            num_zero_progress_preemptions_total=0,
            duration=0.05,
        )
        for i in range(4)
    ]


COUNTERS = {
    "decode-0": {
        "num_preemptions": 5,
        "num_zero_progress_preemptions": 2,
        "num_allocate_slots_calls": 40,
        "deferred_free_blocks_peak": 3,
        "num_blocks_freed_by_drain": 7,
        "kv_corruptions_detected": 0,
    },
    "prefill-0": {
        "num_preemptions": 1,
        "num_zero_progress_preemptions": 0,
        "num_allocate_slots_calls": 10,
        "deferred_free_blocks_peak": 6,
        "num_blocks_freed_by_drain": 0,
        "kv_corruptions_detected": 0,
    },
}


def build(**kw):
    args = dict(
        records=records(),
        scenario="cascade",
        variant="fixed",
        clock="virtual",
        repeat=1,
        seed=42,
        steps=steps(),
        counters_by_node=COUNTERS,
    )
    args.update(kw)
    return build_result(**args)


def test_keys_and_types():
    r = build()
    ints = [
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "max_concurrent_requests",
        "repeat",
        "seed",
        *NODE_COUNTER_KEYS,
    ]
    floats = [
        "duration",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_kv_usage",
        "max_kv_usage",
    ]
    floats += [
        f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p50", "p90", "p99")
    ]
    for k in ints:
        assert type(r[k]) is int, k
    for k in floats:
        assert type(r[k]) is float, k
    assert (r["scenario"], r["variant"], r["clock"], r["schema"]) == (
        "cascade",
        "fixed",
        "virtual",
        "disagg-sim.result/1",
    )
    assert (r["completed"], r["failed"], r["total_input_tokens"], r["total_output_tokens"]) == (2, 1, 40, 4)
    # counters: summed over nodes, peaks take the max
    assert (r["num_preemptions"], r["num_allocate_slots_calls"], r["deferred_free_blocks_peak"]) == (6, 50, 6)
    assert r["nodes"]["decode-0"]["num_blocks_freed_by_drain"] == 7
    assert r["steps_per_node"]["decode-0"]["num_steps"] == 4
    assert r["max_kv_usage"] == 1 - 3 / 8
    assert "requests" not in r
    json.dumps(r, allow_nan=False)  # plain JSON, no NaN


def test_per_request_detail():
    r = build(include_requests=True, include_token_times=True)
    a, b, c = r["requests"]
    assert a["success"] and a["ttft_ms"] == 500.0 and a["e2el_ms"] == 1000.0 and a["num_preemptions"] == 1
    assert a["tpot_ms"] == pytest.approx(250.0) and a["queue_time_ms"] == pytest.approx(100.0)
    assert b["tpot_ms"] is None and a["token_times"] == [0.5, 0.7, 1.0]
    assert not c["success"] and c["ttft_ms"] is None and c["finish_reason"] == "abort"


def test_write_and_load_round_trip(tmp_path):
    r = build()
    json_path, steps_path = write_run(tmp_path, r, steps())
    assert json_path.name == "cascade__fixed__r1.json" and steps_path.name == "cascade__fixed__r1.steps.jsonl"
    loaded = load_result(json_path)
    assert loaded["step_trace"] == steps_path.name
    assert {k: v for k, v in loaded.items() if k != "step_trace"} == {k: v for k, v in r.items() if k != "step_trace"}
    assert read_step_trace(steps_path) == steps()
    assert load_steps_for(loaded, json_path) == steps()
    assert [x["variant"] for x in load_results([tmp_path])] == ["fixed"]


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(ResultsError, match="clock must be one of virtual, wall, got 'cpu'"):
        build(clock="cpu")
    with pytest.raises(ResultsError, match="counter 'num_preemptions' of node 'n' must be an int"):
        aggregate_counters({"n": {"num_preemptions": 1.5}})
    good = build()
    for mutate, message in [
        (lambda d: d.pop("completed"), "missing key 'completed'"),
        (lambda d: d.update(failed="3"), "key 'failed' must be int, got '3'"),
        (lambda d: d.update(num_preemptions=True), "key 'num_preemptions' must be int, got True"),
        (lambda d: d.update(clock="sundial"), "clock must be one of virtual, wall"),
        (lambda d: d.update(schema="other/9"), "schema is 'other/9'"),
    ]:
        d = dict(good)
        mutate(d)
        p = tmp_path / "r.json"
        p.write_text(json.dumps(d))
        with pytest.raises(ResultsError, match=message):
            load_result(p)
    p = tmp_path / "broken.json"
    p.write_text('{"schema": \n')
    with pytest.raises(ResultsError, match="broken.json:2: invalid JSON"):
        load_result(p)
    s = tmp_path / "s.steps.jsonl"
    s.write_text(json.dumps(steps()[0].to_dict()) + '\n{"node": "x"}\n')
    with pytest.raises(ResultsError, match="s.steps.jsonl:2: step record lacks time"):
        read_step_trace(s)


def test_aggregate_counters_accepts_unknown_keys():
    agg = aggregate_counters({"a": {"custom_peak": 3, "custom": 1}, "b": {"custom_peak": 2, "custom": 4}})
    assert agg["custom_peak"] == 3 and agg["custom"] == 5 and agg["num_preemptions"] == 0


def test_step_trace_lines_are_json_dumps_of_each_record(tmp_path):
    import random

    from bench.results import write_step_trace

    # Edge values included: -0.0, tiny and huge floats, huge ints, NaN and
    # infinity (json's spelling), a bool, and a node name that needs escaping.
    values = [0, 1, -1, 2**70, 0.0, -0.0, 1e-7, 1e16, 1.5e300, 0.1, 2 / 3, float("nan"), float("inf"), True, 7]
    rng = random.Random(0)
    steps = [
        StepRecord('d"0\n' if i % 7 == 0 else "decode-0", *[rng.choice(values) for _ in range(19)]) for i in range(2000)
    ]
    path = tmp_path / "t.steps.jsonl"
    write_step_trace(path, steps)
    assert path.read_text() == "".join(json.dumps(s.to_dict()) + "\n" for s in steps)
