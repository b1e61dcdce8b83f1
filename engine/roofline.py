"""A roofline step-time model: a model's shape (engine/model_shape.py) on a
GPU, tensor- and pipeline-parallel, priced from the step's batch.

Per step (all layers; the pipeline executor splits a step's time evenly over
the `pp` stages, connector/stage_pipeline.py):

    time = host time (host_overhead + host_per_seq x rows + host_per_token x tokens)
         + max(linear FLOPs / (F * compute_eff),   weight bytes / (B * memory_eff))
         + MoE: max(expert FLOPs / (F * moe_compute_eff), expert bytes / (B * memory_eff)) + layers x moe_layer
         + max(attention FLOPs / (F * attention_eff), KV bytes / (B * kv_memory_eff))
         + TP all-reduces + PP hand-overs

with F and B the tensor-parallel group's summed peak FLOPS (FP8 for FP8
weights on a GPU with FP8 units, else BF16) and memory bandwidth. Linear
FLOPs are 2 x parameters per token (q/k/v/o and a dense model's MLP) plus
the LM head for each sampled sequence; a MoE model's experts are their own
term, 2 x the k routed experts' parameters per token; weight bytes are read
once per step (for MoE only the experts the step's tokens touch:
E x (1 - (1 - k/E)^T) expected). Attention is 4 x heads x head_dim FLOPs
per (query, key) pair; decode reads every context token's K/V (a
sliding-window layer only the window's) and every step writes its tokens'
K/V. A TP group runs two ring all-reduces of the step's activations per
layer. The why and the numbers:
docs/cost-model.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from .model_shape import GPUSpec, ModelShape, get_gpu, get_model
from .setting import MAX_PP, check_declared, setting
from .step_shape import StepShape

GiB = 1024**3

# KV-pool sizing constants, each from published vLLM start-up logs
# (docs/cost-model.md, "KV cache size and KV handoff bytes").
# Memory outside torch that the profile run adds: 0.25 GiB on one GPU; with
# tp > 1 the NCCL and symmetric-memory all-reduce buffers, 2.07-2.13 GiB per GPU
# (vLLM 0.19, Llama-3.1-8B / Qwen2.5-7B at TP 2 and 4).
NON_TORCH_GiB = 0.25
NON_TORCH_TP_GiB = 2.1
# Bytes per sampled logit in the profile run's sampler peak (fp32 logits +
# sorted fp32 values + int64 indices); vLLM 0.19 measured 15.3-15.5.
SAMPLER_BYTES_PER_LOGIT = 16
# CUDA-graph memory vLLM >= 0.21 estimates and takes from the KV budget:
# 0.51-1.85 GiB, mean 1.04 GiB, over 57 vLLM 0.19 runs on an H100.
CUDAGRAPH_GiB = 1.0


# Weight and KV-cache dtypes a cost model accepts: "auto" is the checkpoint's
# (config.json torch_dtype); "fp8" is vLLM's `--quantization fp8` /
# `--kv-cache-dtype fp8` (one byte per value).
# "mxfp4" (gpt-oss checkpoints): the MoE experts in MXFP4 (4-bit values and
# one 8-bit scale per 32: 4.25 bits), attention and embeddings in BF16, the
# GEMMs at the BF16 peak (weight-only kernels on Hopper and older).
DTYPES = ("auto", "bf16", "fp8", "mxfp4")
WeightDtype = Literal["auto", "bf16", "fp8", "mxfp4"]
KVCacheDtype = Literal["auto", "bf16", "fp8"]
DTYPE_BYTES = {"bf16": 2, "fp8": 1}
MXFP4_BYTES = 4.25 / 8
# Bound of a host time term (ms or us): an hour.
MAX_HOST_TERM = 3_600_000


@dataclass(frozen=True)
class RooflineParams:
    """The few factors a roofline cannot know; `disagg-sim calibrate` fits them."""

    # The engine core's CPU time per step, between GPU launches: scheduling,
    # input preparation and sampling (vLLM V1 with CUDA graphs), as a + b x
    # rows + c x tokens: a per step (ms), b per scheduled sequence (us),
    # c per scheduled token (us). docs/cost-model.md, "Host time", has the
    # profiles and the fit the defaults come from.
    # Each factor is declared here (engine/setting.py): the scenario's roofline
    # mapping derives its keys from these; `from_dict` checks values read
    # from files (presets, gpus.json, fitted sets) against them.
    host_overhead_ms: float = setting(
        1.0,
        doc="Host time per step: host_overhead_ms + host_per_seq_us x rows + host_per_token_us x tokens.",
        ge=0,
        le=MAX_HOST_TERM,
    )
    host_per_seq_us: float = setting(0.0, doc="Host time per scheduled sequence.", ge=0, le=MAX_HOST_TERM)
    host_per_token_us: float = setting(0.0, doc="Host time per scheduled token.", ge=0, le=MAX_HOST_TERM)
    # vLLM's async scheduling (`--async-scheduling`; on by default from vLLM
    # 0.14.0 where pp = 1 and the executor is mp or uni, docs/cost-model.md,
    # "Host time") schedules and prepares step N+1 while step N runs on the
    # GPU: the host time then hides behind the GPU's and a step takes
    # max(host, GPU), not their sum.
    host_overlap: float = setting(
        0.0,
        doc="Share of the host time that runs while the GPU executes (0: in series, as vLLM without async "
        "scheduling; 1: fully overlapped, a step takes max(host, GPU)).",
        ge=0,
        le=1,
    )
    compute_efficiency: float = setting(0.5, doc="Share of peak FLOPS the dense GEMMs reach.", gt=0, le=1)
    # A MoE layer's grouped GEMMs split the step's tokens over the experts:
    # each expert's GEMM has a few rows, far from the tile shapes a dense
    # GEMM of the same FLOPs runs at (docs/cost-model.md, "MoE experts").
    moe_compute_efficiency: float = setting(
        0.5, doc="Share of peak FLOPS the MoE experts' grouped GEMMs reach.", gt=0, le=1
    )
    attention_efficiency: float = setting(0.35, doc="Share of peak FLOPS the attention kernels reach.", gt=0, le=1)
    # Weight reads and K/V reads run in different kernels: a GEMM (GEMV at a
    # few rows) streams each weight matrix once, contiguously; decode
    # attention gathers every row's K/V from 16-token paged blocks scattered
    # over the pool. One factor for both had to be the large batches' (KV
    # reads, 0.5 on Hopper), which made a dense 8B model's weight-bound steps
    # at a few rows twice as long as published (docs/cost-model.md, "Weight
    # reads and K/V reads").
    memory_efficiency: float = setting(
        0.8, doc="Share of peak memory bandwidth the weight reads (GEMMs) reach.", gt=0, le=1
    )
    kv_memory_efficiency: float = setting(
        0.8,
        doc="Share of peak memory bandwidth the attention kernels' K/V reads and writes (paged blocks) reach.",
        gt=0,
        le=1,
    )
    # vLLM's custom all-reduce on H100 NVLink takes 8.5-11.8 us for messages of
    # 0.5-32 KB at TP 2, 4 and 8, within 1 us of each other up to 4 KB
    # (docs/cost-model.md, "Fixed times per layer"): at decode's message sizes
    # it does not grow with the TP size, so it is one number per all-reduce.
    collective_latency_us: float = setting(
        8.0, doc="Fixed cost of one all-reduce or one pipeline hand-over (launch + sync).", ge=0, le=MAX_HOST_TERM
    )
    # 0 (off) by default: the validation's fit sets it (docs/cost-model.md, "Fixed times per layer").
    moe_layer_us: float = setting(
        0.0,
        doc="Fixed time of one MoE layer per step beyond its bytes and FLOPs (router, top-k, token permutation, "
        "the grouped GEMMs' launch and tail).",
        ge=0,
        le=MAX_HOST_TERM,
    )


PARAM_NAMES = tuple(RooflineParams.__dataclass_fields__)


@dataclass(frozen=True)
class RooflineCostModel:
    name: str
    model: ModelShape
    gpu: GPUSpec
    tp: int = setting(1, doc="Tensor-parallel GPUs per pipeline stage.", ge=1, le=MAX_PP)
    pp: int = setting(1, doc="Pipeline stages the model's layers are split over.", ge=1, le=MAX_PP)
    params: RooflineParams = field(default_factory=RooflineParams)
    # Weights' and KV cache's dtype (DTYPES): "fp8" reads one byte per value
    # and runs the GEMMs at the GPU's FP8 peak (the KV cache: one byte per
    # value read, written, moved and stored; attention stays at the 16-bit
    # peak, which is what FlashAttention runs after dequantising).
    dtype: WeightDtype = setting(
        "auto",
        doc='Weights\' dtype: "auto" (the checkpoint\'s), "bf16", or "fp8" (vLLM --quantization fp8: one byte '
        'per weight, GEMMs at the GPU\'s FP8 peak), or "mxfp4" (gpt-oss: MoE experts at 4.25 bits).',
    )
    kv_cache_dtype: KVCacheDtype = setting(
        "auto",
        doc='KV cache dtype: "auto" (the checkpoint\'s) or "fp8" (vLLM --kv-cache-dtype fp8: one byte per value).',
    )

    # -- step time -----------------------------------------------------------
    def step_time(self, shape: StepShape) -> float:
        """Seconds for one step of this shape; an empty step costs nothing."""
        tokens = shape.prefill_tokens + shape.decode_tokens
        if tokens == 0:
            return 0.0
        m, g, p = self.model, self.gpu, self.params
        flops = g.peak_tflops(self.weight_dtype) * 1e12 * self.tp
        attn_peak = g.bf16_tflops * 1e12 * self.tp
        bw = g.memory_bandwidth_GBps * 1e9 * self.tp
        layers, db, act = m.num_hidden_layers, self.weight_bytes_per_value, m.dtype_bytes
        db_mlp = self.mlp_bytes_per_value
        sampled = max(shape.batch_size, 1)

        # Linear layers: every token through the attention projections and
        # its k experts (or the dense MLP); the LM head for sampled rows.
        head = m.vocab_size * m.hidden_size
        mem = bw * p.memory_efficiency
        if m.is_moe:
            # The experts run in their own kernels (vLLM's fused MoE: grouped
            # GEMMs over the tokens each expert got), at their own share of
            # peak: each is priced on its own roofline and the times add.
            e, k = m.num_experts, m.num_experts_per_tok
            touched = e * (1.0 - (1.0 - k / e) ** tokens)
            moe_flops = 2.0 * tokens * layers * (k * m.expert_params + m.hidden_size * e)
            moe_bytes = layers * (touched * m.expert_params * db_mlp + m.hidden_size * e * db)
            t_moe = max(moe_flops / (flops * p.moe_compute_efficiency), moe_bytes / mem)
            # the routing and dispatch kernels' fixed time, which bytes and FLOPs miss at a few rows
            t_moe += layers * p.moe_layer_us * 1e-6
            mlp = 0
        else:
            t_moe, mlp = 0.0, m.expert_params
        dense_flops = 2.0 * tokens * layers * (m.attn_params_per_layer + mlp) + 2.0 * sampled * head
        dense_bytes = layers * (m.attn_params_per_layer * db + mlp * db_mlp) + head * db
        t_linear = max(dense_flops / (flops * p.compute_efficiency), dense_bytes / mem) + t_moe

        # Attention: (query, key) pairs; K/V read for every attended token,
        # written for every new one; summed over the layers (layer_pairs).
        pairs, kv_tokens = self.layer_pairs(shape, tokens)
        attn_flops = 4.0 * m.num_attention_heads * m.head_size * pairs
        kv_bytes = self.kv_bytes_per_token / layers * kv_tokens
        t_attn = max(attn_flops / (attn_peak * p.attention_efficiency), kv_bytes / (bw * p.kv_memory_efficiency))

        t_comm = 0.0
        act_bytes = tokens * m.hidden_size * act  # activations stay 16-bit under FP8 weights
        lat = p.collective_latency_us * 1e-6
        if self.tp > 1:  # two ring all-reduces per layer
            ring = 2.0 * (self.tp - 1) / self.tp * act_bytes / (g.interconnect_GBps * 1e9)
            t_comm += 2 * layers * (ring + lat)
        if self.pp > 1:  # one activation hand-over per stage boundary
            t_comm += (self.pp - 1) * (act_bytes / (g.interconnect_GBps * 1e9) + lat)

        host, gpu = self.host_time(shape.batch_size, tokens), t_linear + t_attn + t_comm
        return host + gpu - p.host_overlap * min(host, gpu)

    def layer_pairs(self, shape: StepShape, tokens: int) -> tuple[float, float]:
        """(query, key) pairs and K/V tokens read or written, each summed over the layers.

        A full-attention layer reads every context token's K/V; a sliding-window layer (gpt-oss's even
        layers, engine/model_shape.py `layer_types`) only the last `sliding_window` of each row's, and each
        query attends to at most that many keys. The step's shape has the rows' sums, not each row's, so a
        sliding layer's terms are min(the sum, rows x window): exact when every row's context is past the
        window (decode at thousands of tokens) or every row's is within it, an upper bound between."""
        m = self.model
        decode_ctx = shape.decode_context_tokens
        prefill_ctx = max(shape.context_tokens - decode_ctx, 0)
        prefill_pairs = shape.prefill_attention_pairs
        sliding = m.num_sliding_layers
        full = m.num_hidden_layers - sliding
        pairs = full * (prefill_pairs + decode_ctx)
        kv = full * (decode_ctx + prefill_ctx + tokens)
        if sliding:
            w = m.sliding_window
            decode_rows = shape.decode_tokens
            prefill_rows = max(shape.batch_size - decode_rows, 0)
            sw_decode = min(decode_ctx, decode_rows * w)
            sw_pairs = min(prefill_pairs, shape.prefill_tokens * w) + sw_decode
            sw_prefill_ctx = min(prefill_ctx, shape.prefill_tokens + prefill_rows * w)
            pairs += sliding * sw_pairs
            kv += sliding * (sw_decode + sw_prefill_ctx + tokens)
        return float(pairs), float(kv)

    def host_time(self, rows: int, tokens: int) -> float:
        """Seconds of engine-core CPU time in a step of `rows` sequences and `tokens` tokens."""
        p = self.params
        return p.host_overhead_ms / 1e3 + (p.host_per_seq_us * rows + p.host_per_token_us * tokens) / 1e6

    # -- dtypes ---------------------------------------------------------------
    @property
    def weight_bytes_per_value(self) -> int:
        """Bytes per weight of attention, embeddings and (but under mxfp4) the MLP."""
        if self.dtype == "auto":
            return self.model.dtype_bytes
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def mlp_bytes_per_value(self) -> float:
        return MXFP4_BYTES if self.dtype == "mxfp4" else self.weight_bytes_per_value

    @property
    def weight_dtype(self) -> str:
        """The GEMMs' dtype: fp8 when the weights are one byte (run at the FP8 peak), else bf16."""
        return "fp8" if self.weight_bytes_per_value == 1 else "bf16"

    @property
    def kv_bytes_per_value(self) -> int:
        return self.model.dtype_bytes if self.kv_cache_dtype == "auto" else DTYPE_BYTES[self.kv_cache_dtype]

    @property
    def weight_bytes(self) -> int:
        m = self.model
        mlp = m.num_hidden_layers * m.mlp_params_per_layer
        return int((m.num_params - mlp) * self.weight_bytes_per_value + mlp * self.mlp_bytes_per_value)

    # -- memory ---------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K/V one token carries across all GPUs: the KV handoff's payload."""
        m = self.model
        return 2 * m.num_hidden_layers * m.num_key_value_heads * m.head_size * self.kv_bytes_per_value

    def kv_bytes_per_token_per_gpu(self) -> int:
        m = self.model
        kv_heads = -(-m.num_key_value_heads // self.tp)  # replicated when tp > kv heads, as vLLM does
        layers = -(-m.num_hidden_layers // self.pp)
        return 2 * layers * kv_heads * m.head_size * self.kv_bytes_per_value

    def num_gpu_blocks(
        self,
        gpu_memory_utilization: float = 0.9,
        block_size: int = 16,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        non_torch_GiB: float | None = None,
        cudagraph_GiB: float = CUDAGRAPH_GiB,
    ) -> int:
        """KV blocks per GPU the way vLLM (v1 `gpu_worker.determine_available_memory`)
        sizes its cache: the memory it may use (`gpu_memory_utilization` x
        total) minus the weights on this GPU, the activation peak of the
        profile run, the memory outside torch (NCCL, all-reduce buffers) and
        the CUDA-graph estimate (taken from the budget since vLLM 0.21; pass
        0 for older versions or enforce-eager), divided by one block's K/V on
        this GPU. Checked against published start-up logs: docs/cost-model.md
        and tests/data/kv_sizing_published.yaml."""
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization={gpu_memory_utilization!r} is invalid; allowed: a number in (0, 1]"
            )
        for name, v in (("non_torch_GiB", non_torch_GiB), ("cudagraph_GiB", cudagraph_GiB)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise ValueError(f"{name}={v!r} is invalid; allowed: a number >= 0 (GiB)")
        total = self.gpu.memory_GB * 1e9
        weights = self.weight_bytes / (self.tp * self.pp)
        if non_torch_GiB is None:
            non_torch_GiB = NON_TORCH_TP_GiB if self.tp > 1 else NON_TORCH_GiB
        non_kv = weights + self.profile_activation_bytes(max_num_batched_tokens, max_num_seqs)
        available = total * gpu_memory_utilization - non_kv - (non_torch_GiB + cudagraph_GiB) * GiB
        per_block = block_size * self.kv_bytes_per_token_per_gpu()
        blocks = int(available // per_block)
        if blocks < 1:
            raise ValueError(
                f"cost model {self.name!r}: no memory left for KV blocks ({available / GiB:.1f} GiB after weights "
                f"of {weights / GiB:.1f} GiB per GPU at gpu_memory_utilization={gpu_memory_utilization}); "
                "allowed: a larger GPU, tp/pp, or utilization"
            )
        return blocks

    def profile_activation_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> float:
        """The torch peak of vLLM's profile run on one GPU: a forward of
        `max_num_batched_tokens` tokens, then the sampler on `max_num_seqs`
        rows. They run one after the other, so the peak is the larger:
        - forward: a layer's MLP holds the gate/up output and its activation
          (3 x intermediate / tp per token, the k routed experts' for MoE)
          next to about 7 hidden-size tensors (residual, norm output, q/k/v,
          attention output);
        - sampler: fp32 logits plus the sorted copy top-k/top-p makes (fp32
          values and int64 indices), 16 B per (row, vocabulary entry); every
          TP rank samples the gathered logits, so it does not shrink with tp."""
        m = self.model
        inter = (m.num_experts_per_tok * m.moe_intermediate_size) if m.is_moe else m.intermediate_size
        forward = max_num_batched_tokens * (3 * inter / self.tp + 7 * m.hidden_size) * m.dtype_bytes
        sampler = max_num_seqs * m.vocab_size * SAMPLER_BYTES_PER_LOGIT
        return max(forward, sampler)

    # -- (de)serialisation ----------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tp": self.tp,
            "pp": self.pp,
            **asdict(self.params),
            # Only when set: presets and results written before these existed stay as they were.
            **{k: getattr(self, k) for k in ("dtype", "kv_cache_dtype") if getattr(self, k) != "auto"},
        }

    @classmethod
    def from_dict(cls, data: dict) -> RooflineCostModel:
        """{model, gpu, tp?, pp?, name?, dtype?, kv_cache_dtype?, <RooflineParams fields>?}; model and gpu
        are shipped names or mappings (config.json fields / datasheet figures)."""
        allowed = {"name", "model", "gpu", "tp", "pp", "dtype", "kv_cache_dtype", *PARAM_NAMES}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"cost model: unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        for key in ("model", "gpu"):
            if key not in data:
                raise ValueError(f"cost model: {key} is missing; allowed: a shipped name or a mapping")
        gpu = get_gpu(data["gpu"])
        # The GPU's measured factors first (gpus.json), then the cost model's own.
        given = {**dict(gpu.efficiency), **{k: data[k] for k in PARAM_NAMES if k in data}}
        unknown_factors = set(given) - set(PARAM_NAMES)
        if unknown_factors:
            raise ValueError(f"gpu {gpu.name!r}: unknown efficiency factor(s) {sorted(unknown_factors)}")
        name = str(data.get("name", "custom"))
        for key, value in given.items():
            check_declared(RooflineParams, key, value, "roofline")
        model = get_model(data["model"])
        for n in ("dtype", "kv_cache_dtype"):
            if data.get(n, "auto") not in DTYPES:
                raise ValueError(f"cost model {name!r}: {n}={data[n]!r} is invalid; allowed: {list(DTYPES)}")
        for n in ("tp", "pp"):
            v = data.get(n, 1)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"cost model {name!r}: {n}={v!r} is invalid; allowed: an int >= 1")
            check_declared(cls, n, v, f"cost model {name!r}")
        if data.get("pp", 1) > model.num_hidden_layers:
            raise ValueError(
                f"cost model {name!r}: pp={data['pp']} is invalid; allowed: <= num_hidden_layers "
                f"({model.num_hidden_layers})"
            )
        return cls(
            name=name,
            model=model,
            gpu=gpu,
            tp=data.get("tp", 1),
            pp=data.get("pp", 1),
            params=RooflineParams(**given),
            dtype=data.get("dtype", "auto"),
            kv_cache_dtype=data.get("kv_cache_dtype", "auto"),
        )

    def with_params(self, **changes: float) -> RooflineCostModel:
        return replace(self, params=replace(self.params, **changes))
