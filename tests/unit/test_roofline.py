"""The roofline cost model: shapes from config.json fields, hand-computed
step times, KV sizing as vLLM does it, presets and their errors."""

from dataclasses import replace

import pytest

from cluster.spec import ClusterSpec
from engine.cost_model import StepShape, cost_model_names, get_cost_model
from engine.model_shape import ModelShape, get_gpu, get_model, shipped_gpus, shipped_models, shipped_presets
from engine.roofline import RooflineCostModel, RooflineParams

PRESETS = {
    "llama-3.1-8b-h100",
    "llama-3.1-8b-a100",
    "llama-3.1-8b-l40s",
    "qwen3-8b-h100",
    "qwen3-8b-a100",
    "qwen3-8b-l40s",
    "llama-3.1-70b-4xh100",
    "llama-3.1-70b-8xh100",
    "qwen3-30b-a3b-h100",
}


def test_shipped_data_cites_a_source_and_presets_resolve():
    for table in (shipped_models(), shipped_gpus()):
        for name, entry in table.items():
            assert entry["source"].startswith("https://"), name
    assert set(shipped_presets()) == PRESETS
    assert PRESETS <= set(cost_model_names())
    for name in PRESETS:
        assert isinstance(get_cost_model(name), RooflineCostModel)


def test_parameter_counts_match_the_published_sizes():
    # Published sizes: 8.03B, 70.6B, 8.19B, 30.5B total parameters.
    assert get_model("llama-3.1-8b").num_params == 8_030_261_248
    assert get_model("llama-3.1-70b").num_params == 70_553_706_496
    assert round(get_model("qwen3-8b").num_params / 1e9, 2) == 8.19
    assert round(get_model("qwen3-30b-a3b").num_params / 1e9, 1) == 30.5


def test_kv_bytes_per_token_from_the_shape():
    assert get_model("llama-3.1-8b").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert get_model("llama-3.1-70b").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert get_model("qwen3-30b-a3b").kv_bytes_per_token == 2 * 48 * 4 * 128 * 2


def _tiny_shape(name="tiny", **extra) -> ModelShape:
    return ModelShape(
        name,
        num_hidden_layers=2,
        hidden_size=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=16,
        vocab_size=10,
        **extra,
    )


def _tiny(tp=1, pp=1, **params) -> RooflineCostModel:
    model = _tiny_shape()
    gpu = get_gpu(
        {"name": "g", "bf16_tflops": 1e-9, "memory_bandwidth_GBps": 1e-6, "memory_GB": 1.0, "interconnect_GBps": 1e-6}
    )
    return RooflineCostModel("tiny", model, gpu, tp, pp, RooflineParams(**params))


def test_decode_step_by_hand():
    # F = 1000 FLOP/s, B = 1000 B/s (x tp); efficiencies 1, no overhead.
    m = _tiny(
        host_overhead_ms=0, compute_efficiency=1, attention_efficiency=1, memory_efficiency=1, collective_latency_us=0
    )
    # attn params/layer: q 8*2*4 + kv 2*8*1*4 + o 2*4*8 = 64+64+64 = 192; mlp 3*8*16 = 384.
    # One decode token, context 3 (incl. itself): linear FLOPs 2*1*2*(192+384) + 2*1*10*8 = 2464;
    # weight bytes (2*(576) + 80)*2 = 2464 -> both 2.464 s.
    # Attention FLOPs 4*2*2*4*3 = 192 -> 0.192 s; KV bytes (2*2*1*4*2=32/token)*(3 + 0 + 1) = 128 -> 0.128 s.
    shape = StepShape(prefill_tokens=0, decode_tokens=1, context_tokens=3, batch_size=1, decode_context_tokens=3)
    assert m.step_time(shape) == pytest.approx(2.464 + 0.192)


def test_prefill_attention_pairs_and_tp_all_reduce_by_hand():
    m = _tiny(
        tp=2,
        host_overhead_ms=1.0,
        compute_efficiency=1,
        attention_efficiency=1,
        memory_efficiency=1,
        collective_latency_us=1e6,
    )
    # 4 prompt tokens from 0: pairs 4*5/2 = 10, context 4, one sampled row.
    shape = StepShape(prefill_tokens=4, context_tokens=4, batch_size=1, prefill_attention_pairs=10)
    lin = max(2 * 4 * 2 * 576 + 2 * 10 * 8, (2 * 576 + 80) * 2) / 2000  # 9376 FLOP vs 2464 B
    attn = max(4 * 2 * 2 * 4 * 10 / 2000, 32 * (4 + 4) / 2000)
    # Two ring all-reduces per layer of 4*8*2 = 64 bytes: 2*(1/2)*64 / 1000 B/s + 1 s latency each.
    comm = 2 * 2 * (64 / 1000 + 1.0)
    assert m.step_time(shape) == pytest.approx(0.001 + lin + attn + comm)
    assert m.step_time(StepShape()) == 0.0


def test_weight_reads_and_kv_reads_have_their_own_efficiency():
    # The decode step of test_decode_step_by_hand: weights 2,464 B, K/V 128 B, attention 192 FLOPs.
    shape = StepShape(prefill_tokens=0, decode_tokens=1, context_tokens=3, batch_size=1, decode_context_tokens=3)
    base = dict(host_overhead_ms=0, compute_efficiency=1, attention_efficiency=1, collective_latency_us=0)
    # K/V at half the bandwidth: 128 / 500 = 0.256 s beats the 0.192 s of FLOPs; the weights stay 2.464 s.
    assert _tiny(**base, memory_efficiency=1, kv_memory_efficiency=0.5).step_time(shape) == pytest.approx(2.464 + 0.256)
    # Weights at half: 4.928 s; the K/V reads at full bandwidth stay under the FLOPs (0.128 < 0.192).
    assert _tiny(**base, memory_efficiency=0.5, kv_memory_efficiency=1).step_time(shape) == pytest.approx(4.928 + 0.192)
    # Both are scenario settings, checked where declared.
    spec = ClusterSpec.model_validate(
        {"cost_model": {"model": "qwen3-8b", "gpu": "h100-sxm", "kv_memory_efficiency": 0.7}}
    )
    assert spec.cost_model.kv_memory_efficiency == 0.7
    with pytest.raises(ValueError, match="kv_memory_efficiency"):
        ClusterSpec.model_validate({"cost_model": {"model": "qwen3-8b", "gpu": "h100-sxm", "kv_memory_efficiency": 0}})


def test_sliding_window_layers_read_only_the_window_by_hand():
    # The tiny model with its first layer a 2-token sliding window (gpt-oss's even layers, 128 tokens).
    sliding = _tiny_shape("tiny-swa", sliding_window=2, layer_types=("sliding_attention", "full_attention"))
    base = dict(host_overhead_ms=0, compute_efficiency=1, attention_efficiency=1, memory_efficiency=1)
    full = _tiny(**base, kv_memory_efficiency=0.25, collective_latency_us=0)
    swa = replace(full, model=sliding)
    # Two decode rows of context 5 and 3 (both past the window): linear 2*2*2*576 + 2*2*10*8 = 4928 FLOP.
    shape = StepShape(decode_tokens=2, context_tokens=8, batch_size=2, decode_context_tokens=8)
    # Full layer: 8 pairs, K/V 8 read + 2 written; sliding layer: 2 + 2 pairs, 4 read + 2 written.
    assert swa.layer_pairs(shape, 2) == (8 + 4, 10 + 6)
    # K/V 16 B per token and layer: 16 x 16 = 256 B at 250 B/s (1.024 s) over 4*2*4*12 = 384 FLOP (0.384 s).
    assert swa.step_time(shape) == pytest.approx(4.928 + 1.024)
    # Both layers full: 2 x 10 K/V tokens, 320 B -> 1.28 s.
    assert full.step_time(shape) == pytest.approx(4.928 + 1.28)
    # A prefill of 4 tokens from 0 (10 pairs): the sliding layer's queries attend to <= 2 keys each, 8 pairs
    # at most (7 exactly: the bound of the rows' sums), and read no more context than the full layer.
    prefill = StepShape(prefill_tokens=4, context_tokens=4, batch_size=1, prefill_attention_pairs=10)
    assert swa.layer_pairs(prefill, 4) == (10 + 8, 8 + 8)
    assert full.layer_pairs(prefill, 4) == (20, 16)
    # gpt-oss as shipped: the even layers of 24 / 36, a 128-token window.
    for name, layers in (("gpt-oss-20b", 24), ("gpt-oss-120b", 36)):
        m = get_model(name)
        assert (m.num_sliding_layers, m.sliding_window) == (layers // 2, 128)
        assert m.layer_types[:2] == ("sliding_attention", "full_attention")
    with pytest.raises(ValueError, match="layer_types=.*allowed: num_hidden_layers"):
        replace(sliding, layer_types=("sliding_attention",))
    # config.json writes null for a model without a window (Qwen2's use_sliding_window false).
    config = {**get_model("qwen3-8b").__dict__, "sliding_window": None, "layer_types": ["full_attention"] * 36}
    qwen2 = get_model(config)
    assert qwen2.num_sliding_layers == 0


def _tiny_moe(**params) -> RooflineCostModel:
    model = ModelShape(
        "tiny-moe",
        num_hidden_layers=2,
        hidden_size=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=16,
        vocab_size=10,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=4,
    )
    gpu = get_gpu(
        {"name": "g", "bf16_tflops": 1e-9, "memory_bandwidth_GBps": 1e-6, "memory_GB": 1.0, "interconnect_GBps": 1e-6}
    )
    return RooflineCostModel("tiny-moe", model, gpu, 1, 1, RooflineParams(**params))


def test_moe_experts_run_at_their_own_efficiency_by_hand():
    # F = 1000 FLOP/s, B = 1000 B/s. One expert: 3 x 8 x 4 = 96 params; router 8 x 4 = 32; attention 192.
    # One decode token, context 3: 2 of the 4 experts touched (4 x (1 - (1 - 2/4)^1)).
    # Dense part (attention projections + LM head): FLOPs 2*1*2*192 + 2*1*80 = 928, bytes 2*192*2 + 80*2 = 928.
    # Experts: FLOPs 2*1*2*(2*96 + 32) = 896; bytes 2*(2*96*2 + 32*2) = 896.
    # Attention: 192 FLOPs vs K/V 128 B.
    shape = StepShape(prefill_tokens=0, decode_tokens=1, context_tokens=3, batch_size=1, decode_context_tokens=3)
    factors = dict(
        host_overhead_ms=0,
        compute_efficiency=1,
        attention_efficiency=1,
        memory_efficiency=1,
        kv_memory_efficiency=1,
        collective_latency_us=0,
    )
    m = _tiny_moe(**factors, moe_compute_efficiency=0.5)
    # Grouped GEMMs at half the peak: 896 / 500 = 1.792 s, above their 0.896 s of bytes; the kernels add.
    assert m.step_time(shape) == pytest.approx(0.928 + 1.792 + 0.192)
    assert m.with_params(moe_compute_efficiency=1).step_time(shape) == pytest.approx(0.928 + 0.896 + 0.192)
    # Plus the MoE layers' fixed time, 2 x 0.25 s.
    assert m.with_params(moe_layer_us=250_000).step_time(shape) == pytest.approx(0.928 + 1.792 + 0.192 + 0.5)
    # A dense model has no expert kernels: the factor moves nothing.
    dense = _tiny(**factors)
    assert dense.with_params(moe_compute_efficiency=0.1).step_time(shape) == dense.step_time(shape)


def test_moe_reads_only_touched_experts():
    m = get_cost_model("qwen3-30b-a3b-h100")
    # The GPU's part: the step less its host time (which the fitted host terms make several ms).
    one = m.step_time(StepShape(decode_tokens=1, context_tokens=1, batch_size=1, decode_context_tokens=1))
    one -= m.host_time(1, 1)
    many = m.step_time(StepShape(decode_tokens=256, context_tokens=256, batch_size=256, decode_context_tokens=256))
    many -= m.host_time(256, 256)
    dense_equivalent = get_model("qwen3-30b-a3b").weight_bytes / 3.35e12 / 0.8
    assert one < dense_equivalent / 4 < many  # 8 of 128 experts at batch 1; nearly all at batch 256


def test_moe_layer_time_is_added_per_layer_to_moe_models_only():
    shape = StepShape(decode_tokens=2, context_tokens=2, batch_size=2, decode_context_tokens=2)
    moe = RooflineCostModel.from_dict({"model": "qwen3-30b-a3b", "gpu": "h100-sxm", "moe_layer_us": 0})
    with_moe = moe.with_params(moe_layer_us=50.0)
    # 48 MoE layers x 50 us, and nothing else moves.
    assert with_moe.step_time(shape) - moe.step_time(shape) == pytest.approx(48 * 50e-6)
    dense = RooflineCostModel.from_dict({"model": "llama-3.1-8b", "gpu": "h100-sxm"})
    assert dense.with_params(moe_layer_us=50.0).step_time(shape) == dense.step_time(shape)
    # Checked where every setting is (the scenario schema, from its one declaration on RooflineParams).
    with pytest.raises(ValueError, match="moe_layer_us"):
        ClusterSpec.model_validate({"cost_model": {"model": "qwen3-30b-a3b", "gpu": "h100-sxm", "moe_layer_us": -1}})
    spec = ClusterSpec.model_validate({"cost_model": {"model": "qwen3-30b-a3b", "gpu": "h100-sxm", "moe_layer_us": 50}})
    assert spec.cost_model.moe_layer_us == 50


def test_num_gpu_blocks_as_vllm_sizes_the_cache():
    m = get_cost_model("llama-3.1-8b-h100")
    weights = 8_030_261_248 * 2
    forward = 8192 * (3 * 14336 + 7 * 4096) * 2  # larger than the sampler's 256 x 128256 x 16 B
    non_torch, cudagraphs = 0.25 * 2**30, 1.0 * 2**30
    available = 84.94e9 * 0.9 - weights - forward - non_torch - cudagraphs
    assert m.num_gpu_blocks(0.9, 16, 8192, 256) == int(available // (16 * 131072))
    # 1,024 rows (vllm serve's H100 default): the sampler's peak is the larger; older vLLM: no graph estimate.
    sampler = 1024 * 128256 * 16
    available = 84.94e9 * 0.9 - weights - sampler - non_torch
    assert m.num_gpu_blocks(0.9, 16, 8192, 1024, cudagraph_GiB=0) == int(available // (16 * 131072))
    with pytest.raises(ValueError, match="cudagraph_GiB=-1 is invalid"):
        m.num_gpu_blocks(cudagraph_GiB=-1)
    # TP 8 shards the 8 KV heads: one per GPU, an eighth of the bytes per block.
    assert get_cost_model("llama-3.1-70b-8xh100").kv_bytes_per_token_per_gpu() == 2 * 80 * 1 * 128 * 2
    with pytest.raises(ValueError, match="no memory left for KV blocks"):
        RooflineCostModel.from_dict({"model": "llama-3.1-70b", "gpu": "l40s"}).num_gpu_blocks()


def test_spec_resolves_auto_sizes_from_the_preset():
    spec = ClusterSpec.model_validate(
        {"cost_model": "llama-3.1-8b-h100", "decode": {"engine": {"num_gpu_blocks": "auto"}}, "bytes_per_token": "auto"}
    )
    m = get_cost_model("llama-3.1-8b-h100")
    assert spec.decode.engine.num_gpu_blocks == m.num_gpu_blocks(0.9, 16, 8192, 128)
    assert spec.bytes_per_token == 131072
    assert spec.prefill.engine.num_gpu_blocks == 1024  # not asked for


@pytest.mark.parametrize(
    "doc,fragment",
    [
        ({"decode": {"engine": {"num_gpu_blocks": "auto"}}}, "num_gpu_blocks='auto' needs a roofline cost model"),
        ({"cost_model": {"model": "llama-9", "gpu": "h100-sxm"}}, "model='llama-9' is unknown"),
        ({"cost_model": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "memory_efficiency": 2}}, "memory_efficiency"),
        ({"cost_model": {"model": {"hidden_size": 8}, "gpu": "h100-sxm"}}, "config is missing"),
        ({"cost_model": "missing-preset.json"}, "cannot read the preset file"),
    ],
)
def test_bad_roofline_settings_name_the_field(doc, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        ClusterSpec.model_validate(doc)


def test_a_config_json_as_published_is_accepted():
    config = {
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
        "rope_theta": 1e6,
    }
    m = get_model(config)
    assert m.is_moe and m.num_experts == 8 and m.moe_intermediate_size == 14336
    assert round(m.num_params / 1e9, 1) == 46.7  # Mixtral-8x7B's published 46.7B


SHAPES = [
    StepShape(decode_tokens=1, context_tokens=1000, batch_size=1, decode_context_tokens=1000),
    StepShape(decode_tokens=64, context_tokens=96_000, batch_size=64, decode_context_tokens=96_000),
    StepShape(prefill_tokens=8192, context_tokens=8192, batch_size=8, prefill_attention_pairs=8 * 1024 * 1025 // 2),
]


@pytest.mark.parametrize(
    ("preset", "model", "gpu"),
    [("qwen3-8b-h100", "qwen3-8b", "h100-sxm"), ("llama-3.1-8b-a100", "llama-3.1-8b", "a100-sxm-80gb")],
)
def test_a_mapping_runs_as_the_preset_of_the_same_model_and_gpu(preset, model, gpu):
    """Issue 32: the scenario mapping dumped RooflineSettings' defaults over the GPU's measured factors."""
    spec = ClusterSpec.model_validate({"cost_model": {"model": model, "gpu": gpu}})
    mapped, named = spec.cost(), get_cost_model(preset)
    assert isinstance(mapped, RooflineCostModel) and mapped.params == named.params
    assert mapped.params.compute_efficiency == dict(get_gpu(gpu).efficiency)["compute_efficiency"] != 0.5
    assert [mapped.step_time(s) for s in SHAPES] == [named.step_time(s) for s in SHAPES]
    # The resolved cluster as a result stores it (nulls for the unset factors) re-reads the same.
    again = ClusterSpec.model_validate(spec.model_dump())
    assert again.cost().params == named.params


def test_a_factor_given_in_the_mapping_wins_over_the_gpus():
    spec = ClusterSpec.model_validate(
        {"cost_model": {"model": "qwen3-8b", "gpu": "h100-sxm", "memory_efficiency": 0.4}}
    )
    params = spec.cost().params
    assert params.memory_efficiency == 0.4
    assert params.compute_efficiency == dict(get_gpu("h100-sxm").efficiency)["compute_efficiency"]
    # 0.4 is below the validation's weight-read grid (>= 0.5), so below any shipped value: a slower weight-bound step.
    assert spec.cost().step_time(SHAPES[0]) > get_cost_model("qwen3-8b-h100").step_time(SHAPES[0])


CATALOGUE = {
    "h100-sxm", "h100-pcie", "h200", "h800", "h20", "b200", "gb200",
    "a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "l40s", "l4", "mi300x",
}  # fmt: skip


def test_the_gpu_catalogue_has_every_gpu_of_issue_32_with_its_class_and_fp8_peak():
    gpus = shipped_gpus()
    assert set(gpus) == CATALOGUE
    for name in CATALOGUE:
        g = get_gpu(name)
        assert g.gpu_class in {"hopper", "ampere", "ada", "blackwell", "cdna3"}, name
        # FP8 runs at twice the dense BF16 rate where there are FP8 units; Ampere has none.
        assert g.fp8_tflops == (0 if g.gpu_class == "ampere" else pytest.approx(2 * g.bf16_tflops, rel=0.02)), name
    assert get_gpu("a100-sxm-40gb").peak_tflops("fp8") == 312.0  # weight-only FP8 at the BF16 peak
    assert get_gpu("h200").peak_tflops("fp8") == 1979.0
    with pytest.raises(ValueError, match="fp8_tflops=-1 is invalid"):
        get_gpu(
            {"bf16_tflops": 1, "memory_bandwidth_GBps": 1, "memory_GB": 1, "interconnect_GBps": 1, "fp8_tflops": -1}
        )


def test_fp8_weights_and_kv_cache_halve_the_bytes_and_run_at_the_fp8_peak():
    # No host time (per step or per row): the GPU's part only.
    no_host = {"host_overhead_ms": 0, "host_per_seq_us": 0}
    bf16 = RooflineCostModel.from_dict({"model": "llama-3.1-8b", "gpu": "h100-sxm", **no_host})
    fp8 = RooflineCostModel.from_dict(
        {"model": "llama-3.1-8b", "gpu": "h100-sxm", **no_host, "dtype": "fp8", "kv_cache_dtype": "fp8"}
    )
    assert fp8.weight_bytes * 2 == bf16.weight_bytes
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token == 131072
    assert fp8.kv_bytes_per_token_per_gpu() * 2 == bf16.kv_bytes_per_token_per_gpu()
    assert fp8.num_gpu_blocks() > 2 * bf16.num_gpu_blocks()  # half the bytes per block and more room
    # Decode at batch 1 reads the weights: half the bytes, half the time (KV reads halve too).
    decode = SHAPES[0]
    assert fp8.step_time(decode) == pytest.approx(bf16.step_time(decode) / 2, rel=0.01)
    # A long prefill is compute-bound: the GEMMs at 1,979 instead of 989 TFLOPS.
    prefill = StepShape(prefill_tokens=8192, context_tokens=8192, batch_size=1, prefill_attention_pairs=8192)
    lin = 2 * 8192 * 32 * (bf16.model.attn_params_per_layer + bf16.model.expert_params) + 2 * 128256 * 4096
    eff = bf16.params.compute_efficiency
    assert bf16.step_time(prefill) - fp8.step_time(prefill) == pytest.approx(
        lin / (989e12 * eff) - lin / (1979e12 * eff), rel=0.02
    )
    assert fp8.to_dict()["dtype"] == "fp8" and "dtype" not in bf16.to_dict()
    with pytest.raises(ValueError, match=r"dtype='int4' is invalid; allowed: \['auto', 'bf16', 'fp8', 'mxfp4'\]"):
        RooflineCostModel.from_dict({"model": "llama-3.1-8b", "gpu": "h100-sxm", "dtype": "int4"})
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        ClusterSpec.model_validate({"cost_model": {"model": "qwen3-8b", "gpu": "h20", "kv_cache_dtype": "fp4"}})


def test_host_time_grows_with_the_batch():
    m = RooflineCostModel.from_dict(
        {
            "model": "qwen3-8b",
            "gpu": "h100-sxm",
            "host_overhead_ms": 2.0,
            "host_per_seq_us": 10.0,
            "host_per_token_us": 1.0,
        }
    )
    assert m.host_time(0, 0) == pytest.approx(0.002)
    assert m.host_time(64, 64) == pytest.approx(0.002 + 64 * 10e-6 + 64 * 1e-6)
    base = m.with_params(host_per_seq_us=0.0, host_per_token_us=0.0)
    assert m.step_time(SHAPES[1]) - base.step_time(SHAPES[1]) == pytest.approx(64 * 11e-6)


def test_async_scheduling_hides_the_host_time_behind_the_gpus():
    # vLLM's async scheduling prepares step N+1 while step N runs: with host_overlap 1 a step takes
    # max(host, GPU); 0 (vLLM before 0.14's default) their sum; between, the share given overlaps.
    serial = RooflineCostModel.from_dict({"model": "qwen3-8b", "gpu": "h100-sxm", "host_per_seq_us": 100.0})
    shape = SHAPES[1]
    host = serial.host_time(shape.batch_size, shape.prefill_tokens + shape.decode_tokens)
    gpu = serial.step_time(shape) - host
    assert 0 < host < gpu
    assert serial.with_params(host_overlap=1.0).step_time(shape) == pytest.approx(gpu)
    assert serial.with_params(host_overlap=0.5).step_time(shape) == pytest.approx(gpu + host / 2)
    host_bound = serial.with_params(host_per_seq_us=10_000.0, host_overlap=1.0)
    assert host_bound.step_time(shape) == pytest.approx(host_bound.host_time(shape.batch_size, 64))
    with pytest.raises(ValueError, match="host_overlap"):
        RooflineCostModel.from_dict({"model": "qwen3-8b", "gpu": "h100-sxm", "host_overlap": 1.5})


def test_mxfp4_puts_the_experts_at_4_25_bits_and_the_rest_at_bf16():
    bf16 = RooflineCostModel.from_dict({"model": "gpt-oss-120b", "gpu": "h100-sxm"})
    mx = RooflineCostModel.from_dict({"model": "gpt-oss-120b", "gpu": "h100-sxm", "dtype": "mxfp4"})
    m = mx.model
    experts = m.num_hidden_layers * m.mlp_params_per_layer
    assert mx.weight_bytes == int((m.num_params - experts) * 2 + experts * 4.25 / 8)
    assert 60e9 < mx.weight_bytes < 66e9  # the published checkpoint: ~60.8 GiB
    assert mx.step_time(SHAPES[1]) < bf16.step_time(SHAPES[1]) / 2  # batch 64 reads most experts
