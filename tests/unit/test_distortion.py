"""Time distortion of a wall-clock run: per-step overhead against the scaled
model, the suggested time_scale, per-request errors against the twin, and
the lines under the table."""

import pytest

from bench.wall_twin import distortion_lines, twin_spec
from cluster.distortion import request_distortion, step_distortion, suggested_time_scale, summarize
from cluster.spec import ClusterSpec


def test_step_overhead_is_completion_beyond_the_model():
    # (index, submitted, completed, modelled_s, run_s); time_scale 0.5.
    timings = [
        (1, 0.000, 0.011, 0.020, 0.010),  # due 0.010: 1 ms late
        (2, 0.001, 0.023, 0.020, 0.010),  # queued behind step 1: due 0.021, 2 ms late
        (3, 0.030, 0.040, 0.020, 0.010),  # idle stage: due 0.040, on time
        (4, 0.040, 0.040, 0.0, 0.0),  # empty step: not counted
    ]
    d = step_distortion(timings, pp_size=1)
    assert d["steps"] == 3
    assert d["mean_scaled_ms"] == pytest.approx(10.0)
    assert d["mean_modelled_ms"] == pytest.approx(20.0)
    assert d["mean_overhead_ms"] == pytest.approx(1.0)
    assert d["overhead_pct"] == pytest.approx(10.0)


def test_pipeline_steps_are_due_a_stage_share_apart():
    timings = [(1, 0.0, 0.010, 0.01, 0.010), (2, 0.0, 0.015, 0.01, 0.010)]  # pp 2: due 0.010 and 0.015
    assert step_distortion(timings, pp_size=2)["mean_overhead_ms"] == pytest.approx(0.0, abs=1e-9)
    assert step_distortion([], 1) is None


def test_suggested_time_scale_is_round_and_enough():
    # 2 ms overhead on 10 ms modelled steps: 10 % needs 2 x 1.5 / (0.1 x 10) = 3 -> 5.
    assert suggested_time_scale(0.002, 0.010) == 5.0
    assert suggested_time_scale(0.0001, 0.010) == 0.2
    assert suggested_time_scale(0.0, 0.010) == 0.0


def test_summary_warns_with_a_time_scale():
    node = {"mean_modelled_ms": 10.0, "mean_scaled_ms": 0.5, "mean_overhead_ms": 2.0, "overhead_pct": 400.0}
    s = summarize({"decode-0": node, "prefill-0": {**node, "overhead_pct": 1.0}}, time_scale=0.05)
    assert s["worst_node"] == "decode-0" and s["suggested_time_scale"] == 5.0
    assert "use time_scale >= 5" in s["warning"]
    quiet = summarize({"decode-0": {**node, "overhead_pct": 5.0}}, 1.0)
    assert "warning" not in quiet


def test_request_errors_against_the_twin():
    wall = {"a": (0.05, 1.0), "b": (0.06, 1.1)}  # wall seconds at time_scale 0.1
    twin = {"a": (0.5, 10.0), "b": (0.5, 10.0)}
    d = request_distortion(wall, twin, 0.1)
    assert d["requests"] == 2
    assert d["median_ttft_error_pct"] == pytest.approx(10.0)
    assert d["median_e2el_error_pct"] == pytest.approx(5.0)


def test_twin_spec_expresses_the_network_in_model_time():
    spec = ClusterSpec.model_validate(
        {"time_scale": 0.05, "links": {"kv": {"delay_ms": 1.0, "jitter_ms": 0.2, "bandwidth_MBps": 500}}}
    )
    twin = twin_spec(spec)
    assert twin.time_scale == 1.0
    assert twin.links.kv.delay_ms == pytest.approx(20.0)
    assert twin.links.kv.jitter_ms == pytest.approx(4.0)
    assert twin.links.kv.bandwidth_MBps == pytest.approx(25.0)
    assert twin.kv_pull_timeout_s == pytest.approx(40.0)


def test_lines_under_the_table_show_overhead_spread_and_warning():
    def result(repeat, duration, pct):
        node = {"mean_overhead_ms": 2.0, "mean_scaled_ms": 0.5, "overhead_pct": pct}
        dist = {"overhead_pct": pct, "worst_node": "decode-0", "nodes": {"decode-0": node}}
        if pct > 10:
            dist["warning"] = "decode-0: ... use time_scale >= 5"
        dist["requests"] = {"median_ttft_error_pct": 3.0, "median_e2el_error_pct": 250.0}
        return {
            "variant": "fixed",
            "repeat": repeat,
            "duration": duration,
            "output_throughput": 100 / duration,
            "extra": {"distortion": dist},
        }

    lines = distortion_lines([result(0, 7.7, 400.0), result(1, 7.4, 380.0), result(2, 2.0, 50.0)])
    text = "\n".join(lines)
    assert "fixed r0: step overhead 400.0 % (decode-0: 2.00 ms on 0.50 ms per step)" in text
    assert "E2EL +250.0 %" in text
    assert "beyond ±10 %" in text
    assert lines[-1] == "warning: fixed: decode-0: ... use time_scale >= 5"
    assert distortion_lines([{"variant": "v", "repeat": 0, "duration": 1.0, "output_throughput": 1.0}]) == []


def test_a_ray_run_reads_in_model_time_and_keeps_its_wall_clock_figures():
    from bench.wall_twin import to_model_time, wall_clock_metrics
    from cluster.run_result import RunResult
    from engine.records import RequestRecord, StepRecord

    rec = RequestRecord("r0", arrival_time=1.0, prompt_len=8, max_tokens=2, first_scheduled_time=1.5)
    rec.token_times, rec.finish_time = [2.0, 2.5], 2.5
    step = StepRecord("decode-0", 2.0, 0, 1, 1, 0, 1, 1, 0, 0, 10, 0, 16, 1, 0, 0, duration=0.25)
    wall = RunResult("wall", duration=3.0, requests=[rec], steps=[step], node_counters={}, extra={"time_scale": 0.5})
    model = to_model_time(wall)
    (r,) = model.requests
    assert (r.arrival_time, r.first_scheduled_time, r.token_times, r.finish_time) == (2.0, 3.0, [4.0, 5.0], 5.0)
    assert (model.duration, model.steps[0].time, model.steps[0].duration) == (6.0, 4.0, 0.25)
    assert wall.requests[0].token_times == [2.0, 2.5]  # the wall run is left as it was
    assert r.ttft == 2 * rec.ttft
    figures = {"median_ttft_ms": 100.0, "output_throughput": 900.0, "duration": 3.0, "completed": 1}
    assert wall_clock_metrics(figures, 0.5) == {
        "time_scale": 0.5,
        **{k: figures[k] for k in figures if k != "completed"},
    }
