"""`disagg-sim validate-cost`: the published points load and quote their
numbers, the command runs on a subset, and docs/validation.md is what the
command wrote (rendered from the stored predictions, which a re-run of the
subset reproduces exactly)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main
from bench.validation.cli import load_results, split
from bench.validation.dataset import INDEPENDENT, load_all, load_points
from bench.validation.fit import load_fitted
from bench.validation.report import render

ROOT = Path(__file__).resolve().parents[2]
# Fast points (about a second each): a closed loop of 4, 1,000 tiny requests, one request of another
# source, a 1P1D run over NIXL.
FAST = [
    "gpustack-qwen3-8b-h100-sharegpt-c4",
    "gpustack-qwen3-14b-h100-random-128",
    "cloudera-qwen2-7b-a100-80gb-kv24g-random-1k1k-n1",
    "anyscale-gpt-oss-120b-h100-sxm-pd-1p4-1d4-pack-c4",
]


def test_the_dataset_has_enough_points_each_quoting_its_numbers():
    points = load_points()
    assert len(points) >= 15
    for p in points:
        assert p.source.url.startswith("https://github.com/") and "/blob/" in p.source.url
        quote = p.source.quote
        pub = p.published
        for line in (
            f"Mean TTFT (ms): {pub.mean_ttft_ms:.2f}",
            f"Mean TPOT (ms): {pub.mean_tpot_ms:.2f}",
            f"Output token throughput (tok/s): {pub.output_throughput:.2f}",
            f"Benchmark duration (s): {pub.duration_s:.2f}",
            f"Total input tokens: {pub.total_input_tokens}",
            f"Total generated tokens: {pub.total_output_tokens}",
        ):
            assert line in quote, (p.id, line)


def test_both_files_load_with_their_sources_and_every_pd_point_is_simulated():
    every = load_all()
    assert len(every) > len(load_points()) and INDEPENDENT.exists()
    assert len({p.lab for p in every}) >= 4
    sim, skipped = split(every)
    pd = [p for p in sim if p.pd is not None]
    assert len(pd) >= 16 and len({p.lab for p in pd}) >= 3
    assert not [p.id for p, _ in skipped if p.pd is not None]


def _point(pid):
    return next(p for p in load_all() if p.id == pid)


def test_a_pd_point_runs_its_pools_behind_the_proxy_with_its_connectors_preset():
    from bench.validation.simulate import scenario_for
    from engine.roofline import RooflineParams

    pack = scenario_for(_point("anyscale-gpt-oss-120b-h100-sxm-pd-1p4-1d4-pack-c4"), RooflineParams())["cluster"]
    assert pack["prefill"]["count"] == 1 and pack["decode"]["count"] == 1
    assert pack["prefill"]["engine"] == pack["decode"]["engine"]
    # The benchmark's test prompt made first contact before the measured run.
    assert pack["kv_transfer"] == {"preset": "nixl", "handshake_s": 0.0, "prefill_tp": 4, "decode_tp": 4}
    assert pack["bytes_per_token"] == "auto" and pack["links"] == {"kv": {}}
    assert pack["kv_pull_timeout_s"] == 480.0
    # A measured fabric is the wire's bandwidth (shared by concurrent pulls), not the connector's.
    tcp = scenario_for(_point("anyscale-gpt-oss-120b-h100-sxm-pd-1p4-1d4-spread-tcp-c4"), RooflineParams())
    kv = tcp["cluster"]["kv_transfer"]
    assert kv["preset"] == "none" and "bandwidth_GBps" not in kv and kv["descriptor_us"] == 3.9
    assert tcp["cluster"]["links"] == {"kv": {"bandwidth_MBps": 110.0}}
    nccl = scenario_for(_point("lmcache-kuntaidu-llama-3.1-8b-h100-pd-1p1d-p2pnccl-8k200-rr3.6"), RooflineParams())
    assert nccl["cluster"]["kv_transfer"]["preset"] == "p2pnccl"
    assert nccl["workload"]["arrival"] == {"kind": "gamma", "rate": 3.6, "burstiness": 100.0}
    router = scenario_for(_point("vllmrouter-llama-3.1-8b-h100-pd-8p1-8d1-nixl-c16"), RooflineParams())["cluster"]
    assert (router["prefill"]["count"], router["decode"]["count"]) == (8, 8)
    assert router["decode"]["engine"]["block_size"] == 128  # --block-size 128 as served


def test_command_runs_on_a_subset_and_reproduces_the_stored_predictions(tmp_path, capsys):
    out, res = tmp_path / "v.md", tmp_path / "r.json"
    argv = ["validate-cost", "--out", str(out), "--results", str(res)]
    for pid in FAST:
        argv += ["--only", pid]
    assert main(argv) == 0
    fresh = json.loads(res.read_text())
    assert sorted(fresh) == sorted(FAST)
    stored = load_results()
    for pid in FAST:
        assert fresh[pid] == stored[pid], f"{pid}: results.json is stale; regenerate: disagg-sim validate-cost"
    text = out.read_text()
    assert all(f"[{pid}](" in text for pid in FAST)
    assert "Median absolute error" in capsys.readouterr().out


def test_docs_validation_is_the_commands_output():
    doc = (ROOT / "docs" / "validation.md").read_text()
    sim, skipped = split(load_all())
    fitted = load_fitted()
    expected = render(sim, skipped, fitted["in_sample"], fitted["held_out"], load_results())
    assert doc == expected, "regenerate: disagg-sim validate-cost"


def test_every_source_has_its_held_out_fit():
    sim, _ = split(load_all())
    fitted = load_fitted()
    assert {p.lab for p in sim} == set(fitted["held_out"])
    # A source with only P/D points (which no fit uses) is held out by the in-sample fit itself.
    assert fitted["held_out"]["lmcache"] == fitted["in_sample"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--only", "gpustack-qwen3-8b-h100-sharegpt"], "did you mean"),
        (["--dataset", "no/such.yaml"], "no such file"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, fragment):
    assert main(["validate-cost", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]


def test_the_shipped_gpu_specs_carry_the_fitted_factors():
    """What docs/validation.md validates is what a preset on these GPUs runs."""
    from engine.cost_model import get_cost_model
    from engine.model_shape import get_gpu, shipped_gpus

    fitted = load_fitted()["in_sample"]
    for name in shipped_gpus():
        gpu = get_gpu(name)
        shipped = dict(gpu.efficiency)
        expected = {**fitted.classes.get(gpu.gpu_class, {}), **fitted.weights, **fitted.host, **fitted.layers}
        assert shipped == expected, name
    preset = get_cost_model("llama-3.1-8b-h100")
    assert preset.params.compute_efficiency == fitted.classes["hopper"]["compute_efficiency"]
    assert preset.params.memory_efficiency == fitted.weights["memory_efficiency"]
    assert preset.params.kv_memory_efficiency == fitted.classes["hopper"]["kv_memory_efficiency"]


def test_fixed_times_are_fitted_only_where_low_load_points_identify_them():
    from bench.validation.fit import START_LAYERS, Fitted, identified_terms, is_low_load

    sim, _ = split(load_all())
    low = [p for p in sim if is_low_load(p)]
    # The all-reduce keeps its cited time although TP > 1 points are among them (fit.PINNED_LAYERS).
    assert any(p.tp > 1 for p in low)
    assert identified_terms(low) == ["memory_efficiency", "host_overhead_ms", "moe_layer_us"]
    assert load_fitted()["in_sample"].layers["collective_latency_us"] == START_LAYERS["collective_latency_us"]
    # Without Anyscale's gpt-oss-120b runs the one MoE point at low load is a Qwen3-30B-A3B run on one H100
    # (10 in flight): it alone identifies the MoE layer's time; without it too, no low-load point runs a MoE.
    no_anyscale = [p for p in low if p.lab != "anyscale"]
    assert identified_terms(no_anyscale) == ["memory_efficiency", "host_overhead_ms", "moe_layer_us"]
    no_moe = [p for p in no_anyscale if p.lab != "vllm-pr23151-wenchen76"]
    assert identified_terms(no_moe) == ["memory_efficiency", "host_overhead_ms"]
    fitted = load_fitted()
    assert fitted["held_out"]["anyscale"].layers["collective_latency_us"] == START_LAYERS["collective_latency_us"]
    # A fitted.json written before the per-layer terms reads with the cited values.
    old = fitted["in_sample"].to_dict()
    del old["layers"]
    assert Fitted.from_dict(old).layers == START_LAYERS


def test_an_engine_run_is_keyed_only_by_the_terms_it_can_see():
    from bench.validation.fit import relevant_params
    from engine.roofline import RooflineParams

    dense = _point("gpustack-qwen3-8b-h100-sharegpt-c4")
    moe_tp4 = _point("anyscale-gpt-oss-120b-h100-sxm-agg-2xtp4-c4")
    a = RooflineParams(collective_latency_us=8.0, moe_layer_us=0.0, moe_compute_efficiency=0.5)
    b = RooflineParams(collective_latency_us=24.0, moe_layer_us=30.0, moe_compute_efficiency=0.3)
    assert relevant_params(dense, a) == relevant_params(dense, b)
    assert relevant_params(moe_tp4, a) != relevant_params(moe_tp4, b)
    assert relevant_params(moe_tp4, b) == b


def test_each_replica_has_its_own_api_server_in_the_replay():
    from bench.validation.front_end_replay import Emissions, replay
    from engine.front_end import FrontEndParams
    from engine.records import WorkloadRequest

    # Three requests at t=0, 10 ms of server time each (request_ms), the engine's one token 1 ms after it has one.
    work = [WorkloadRequest(f"r{i}", 0.0, 100, 1) for i in range(3)]
    em = {w.request_id: Emissions(w.request_id, 100, ((0.001, 1),)) for w in work}
    fe = FrontEndParams(request_ms=10.0, prompt_token_us=0.0, output_token_us=0.0, ipc_ms=0.0)
    # One server: tokenized in turn, ready at 10, 20, 30 ms; r0's and r1's tokens (11, 21 ms) are streamed by
    # the same server after the tokenizations before them, at 30 ms; r2's at 31.
    one = [r.token_times[0] for r in replay(work, em, fe, None)]
    assert one == pytest.approx([0.030, 0.030, 0.031])
    # Two (round robin: r0 and r2 on the first, r1 on the second): r1 ready at 10 ms, its token seen at 11;
    # the first server tokenizes r0 then r2 (10, 20 ms), streams r0's token after r2's tokenization (20 ms)
    # and r2's at 21.
    two = [r.token_times[0] for r in replay(work, em, fe, None, servers=2)]
    assert two == pytest.approx([0.020, 0.011, 0.021])
    with pytest.raises(ValueError, match="servers=0 is invalid"):
        replay(work, em, fe, None, servers=0)


def test_a_point_has_one_api_server_per_engine_instance_serving_the_client():
    from bench.validation.simulate import api_servers

    assert api_servers(_point("anyscale-gpt-oss-120b-h100-sxm-agg-4xtp2-c4")) == 4
    assert api_servers(_point("vllmrouter-llama-3.1-8b-h100-pd-8p1-8d1-nixl-c16")) == 8
    assert api_servers(_point("gpustack-qwen3-8b-h100-sharegpt-c4")) == 1


def test_a_held_out_fit_starts_from_the_in_sample_values_its_points_identify():
    from bench.validation.fit import START_FRONT_END, Fitted, warm_start
    from engine.front_end import FrontEndParams

    start = Fitted(
        classes={"hopper": {"compute_efficiency": 0.4}, "cdna3": {"compute_efficiency": 0.3}},
        host={"host_per_seq_us": 40.0, "host_overhead_ms": 0.5},
        front_end=FrontEndParams(request_ms=1.0, prompt_token_us=1.3, output_token_us=50.0, ipc_ms=1.0),
        weights={"memory_efficiency": 0.85},
    )
    sim, _ = split(load_all())
    # Without AMD's one MI300X point the cdna3 class is not fitted: the defaults, as from scratch.
    no_amd = warm_start([p for p in sim if p.lab != "amd"], start)
    assert set(no_amd.classes) == {"hopper"} and no_amd.host == start.host and no_amd.weights == start.weights
    # Anyscale's runs alone: closed loops of 64 keep the host per row, those of 4 the small steps' terms and
    # the API server's.
    anyscale = warm_start([p for p in sim if p.lab == "anyscale"], start)
    assert anyscale.host == start.host and anyscale.front_end == start.front_end
    # AMD's one run at 32 in flight: no batch of >= 64 (no host per row), no small steps, no cheap replay.
    amd = warm_start([p for p in sim if p.lab == "amd"], start)
    assert (amd.host, amd.weights, amd.front_end) == ({}, {}, START_FRONT_END)
    # P/D points alone identify nothing.
    pd = warm_start([p for p in sim if p.pd is not None], start)
    assert (pd.classes, pd.host, pd.weights, pd.front_end) == ({}, {}, {}, START_FRONT_END)


def test_async_scheduling_follows_the_version_unless_the_point_says():
    # vLLM schedules asynchronously by default from 0.14.0 at pp 1 (docs/cost-model.md, "Host time"); the cost
    # model then overlaps the host time with the GPU's.
    from bench.validation.simulate import async_scheduling, cost_dict
    from engine.roofline import RooflineParams

    scicom = _point("scicom-qwen3-32b-h100-sxm-tp8-random-1k128-c100")  # vLLM 0.14.1
    gpustack = _point("gpustack-qwen3-14b-h100-sharegpt")  # vLLM 0.11.0
    amd = _point("amd-qwen3guard-gen-8b-mi300x-random-1k1k-c32")  # an image of 2026: the point says
    assert (async_scheduling(scicom), async_scheduling(gpustack), async_scheduling(amd)) == (True, False, True)
    assert not async_scheduling(scicom.model_copy(update={"pp": 2}))
    assert not async_scheduling(scicom.model_copy(update={"async_scheduling": False}))
    assert async_scheduling(gpustack.model_copy(update={"vllm_version": "0.15.0"}))
    assert cost_dict(scicom, RooflineParams())["host_overlap"] == 1.0
    assert cost_dict(gpustack, RooflineParams())["host_overlap"] == 0.0
