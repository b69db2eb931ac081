"""Model configs lowered to per-layer-type costs (FLOPs, off-chip bytes, kernels) per token.

Every cost is *per device* (tensor-parallel shards divide the sharded parts) and
*per step* or *per token of a step*, so the physics only multiplies by the
tokens a step processes. Training multiplies the forward cost by 3 (forward,
input-gradient and weight-gradient GEMMs), as PaLM / Megatron count model FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LAYER_TYPES: tuple[str, ...] = (
    "attention",
    "mlp",
    "embedding",
    "norm",
    "softmax",
    "moe_router",
    "allreduce",
    "conv",
    "other",
)

Mode = Literal["train", "serve"]
BF16 = 2.0  # bytes per element


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Cost of one layer type: FLOPs and bytes per token, bytes per step, kernel traits."""

    flops_tok: float
    weight_bytes: float = 0.0  # per step, independent of the batch (weights streamed once per pass)
    act_bytes_tok: float = 0.0  # compulsory activation / KV-cache bytes per token
    reuse_bytes_tok: float = (
        0.0  # tile re-reads per token: SRAM hits stay on chip, misses go to HBM
    )
    kernels: float = 1.0  # launches per step; each costs a fixed overhead
    eff_compute: float = 0.7  # best share of peak FLOP/s this kernel class reaches
    eff_mem: float = 0.85  # best share of HBM bandwidth
    occupancy: float = 0.5
    sram_hit: float = 0.8
    kernel: str = "generic"
    fallback_kernel: str = "generic_fallback"


@dataclass(frozen=True, slots=True)
class Workload:
    """A model lowered to layer types, with how it batches and communicates."""

    name: str
    mode: Mode
    layers: dict[str, LayerCost]
    params: float
    tokens_per_step: float = 0.0  # training: tokens one device processes per step
    micro_batch: float = 1.0  # training: sequences per step (reported as ingress.batch)
    gen_tokens: float = 1.0  # serving: tokens generated per request (decode steps)
    tokens_per_seq: float = 1.0  # serving: tokens per sequence per step (decode + chunked prefill)
    max_batch: float = 256.0  # serving: concurrent sequences the engine admits
    tick_s: float = 0.025  # serving: scheduling tick the router sizes batches for (> step time)
    comm_bytes_tok: float = 0.0  # all-reduce message bytes per token (tensor parallel)
    comm_bytes_step: float = 0.0  # all-reduce message bytes per step (data-parallel gradients)
    quality: float = 0.97  # serving: validation quality score of this model
    notes: str = field(default="", compare=False)


def dense_llm(
    name: str,
    *,
    d: int,
    n_layers: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    mode: Mode,
    tp: int = 1,
    seq: int = 8192,
    micro_batch: int = 1,
    prompt: int = 512,
    gen: int = 256,
    max_batch: int = 256,
    tick_s: float = 0.025,
    grad_accum: int = 8,
    experts: int = 0,
    top_k: int = 2,
) -> Workload:
    """Lower a decoder-only transformer (dense, or MoE when `experts` > 0) to layer costs."""
    hd = d // heads
    kvd = kv_heads * hd
    train = mode == "train"
    pm = 3.0 if train else 1.0  # forward + backward passes
    ctx = seq / 2 if train else prompt + gen / 2  # mean attended context per token
    lyr = float(n_layers)
    shard = lyr / tp

    proj_params = d * (d + 2 * kvd) + d * d
    attn_flops = (2 * proj_params + 4 * ctx * d) * shard * pm
    attn_w = BF16 * proj_params * shard * pm
    if train:
        attn_act = BF16 * (2 * d + 2 * kvd) * shard * pm
        # flash attention re-reads K/V once per 128-query block (causal: half of them)
        attn_reuse = BF16 * 2 * kvd * (seq / 128) * 0.5 * shard * pm
    else:
        # a decode token reads its sequence's whole KV cache; chunked-prefill tokens do not
        attn_act = BF16 * (2 * d + 2 * kvd + 2 * kvd * ctx * gen / (prompt + gen)) * shard
        attn_reuse = BF16 * 4 * d * shard

    mlp_mats = 3 * d * ffn  # SwiGLU: gate, up, down
    active = top_k if experts else 1
    mlp_flops = 2 * mlp_mats * active * shard * pm
    mlp_w = BF16 * mlp_mats * max(experts, 1) * shard * pm
    mlp_act = BF16 * (2 * d + 3 * ffn) * active * shard * pm
    # each 128-token tile re-reads the weight panel it multiplies
    mlp_reuse = BF16 * mlp_mats * active * shard * pm / 128

    layers: dict[str, LayerCost] = {
        "attention": LayerCost(
            flops_tok=attn_flops,
            weight_bytes=attn_w,
            act_bytes_tok=attn_act,
            reuse_bytes_tok=attn_reuse,
            kernels=lyr * 3 * pm,
            eff_compute=0.58,
            eff_mem=0.82,
            occupancy=0.45,
            sram_hit=0.82,
            kernel="flash_attn_v3",
            fallback_kernel="sdpa_math",
        ),
        "mlp": LayerCost(
            flops_tok=mlp_flops,
            weight_bytes=mlp_w,
            act_bytes_tok=mlp_act,
            reuse_bytes_tok=mlp_reuse,
            kernels=lyr * 3 * pm,
            eff_compute=0.74,
            eff_mem=0.86,
            occupancy=0.55,
            sram_hit=0.86,
            kernel="cutlass_gemm_grouped" if experts else "cutlass_gemm_swiglu",
            fallback_kernel="cublas_gemm_default",
        ),
        "embedding": LayerCost(
            flops_tok=2.0 * d * (2.0 if train else 1.0),
            act_bytes_tok=BF16 * 2 * d * pm,
            kernels=2.0 * (2.0 if train else 1.0),
            eff_compute=0.3,
            eff_mem=0.45,
            occupancy=0.8,
            sram_hit=0.12,
            kernel="embedding_gather",
            fallback_kernel="index_select",
        ),
        "norm": LayerCost(
            flops_tok=2 * 5.0 * d * lyr * pm,
            act_bytes_tok=BF16 * 2 * 2 * d * lyr * pm,
            kernels=2 * lyr * pm,
            eff_compute=0.3,
            eff_mem=0.8,
            occupancy=0.85,
            sram_hit=0.35,
            kernel="rmsnorm_fused",
            fallback_kernel="rmsnorm_eager",
        ),
        "softmax": LayerCost(
            flops_tok=5.0 * vocab / tp * (2.0 if train else 1.0),
            act_bytes_tok=BF16 * 2 * vocab / tp * (2.0 if train else 1.0),
            kernels=2.0 if train else 1.0,
            eff_compute=0.3,
            eff_mem=0.78,
            occupancy=0.8,
            sram_hit=0.4,
            kernel="softmax_xent_fused" if train else "softmax_sample",
            fallback_kernel="softmax_eager",
        ),
        "other": LayerCost(
            # LM head GEMM plus residual adds and rotary embedding
            flops_tok=(2.0 * d * vocab / tp + 4.0 * d * lyr) * pm,
            weight_bytes=BF16 * d * vocab / tp * pm,
            act_bytes_tok=BF16 * 3 * d * lyr * pm,
            reuse_bytes_tok=BF16 * d * vocab / tp * pm / 128,
            kernels=lyr * 2 * pm,
            eff_compute=0.7,
            eff_mem=0.8,
            occupancy=0.5,
            sram_hit=0.8,
            kernel="cublas_gemm_lmhead",
            fallback_kernel="cublas_gemm_default",
        ),
    }
    params = lyr * (proj_params + mlp_mats * max(experts, 1)) + 2.0 * d * vocab
    if experts:
        layers["moe_router"] = LayerCost(
            flops_tok=(2.0 * d * experts + 10.0 * experts) * lyr * pm / tp,
            weight_bytes=BF16 * d * experts * lyr * pm / tp,
            act_bytes_tok=BF16 * (d + 4 * experts) * lyr * pm / tp,
            kernels=lyr * 3 * pm,
            eff_compute=0.25,
            eff_mem=0.6,
            occupancy=0.6,
            sram_hit=0.5,
            kernel="topk_router_fused",
            fallback_kernel="topk_router_eager",
        )
    comm_tok = 0.0
    if tp > 1:
        # Megatron TP: two activation all-reduces per layer forward, two more backward
        comm_tok = BF16 * d * 2 * lyr * (2.0 if train else 1.0)
    if experts:
        comm_tok += BF16 * d * top_k * 2 * lyr / max(tp, 1)  # expert all-to-all dispatch + combine
    comm_step = BF16 * params / tp / grad_accum if train else 0.0
    if comm_tok or comm_step:
        layers["allreduce"] = LayerCost(
            flops_tok=0.0,
            kernels=lyr * (4.0 if train else 2.0) if tp > 1 else 4.0,
            eff_compute=1.0,
            eff_mem=1.0,
            occupancy=0.12,
            sram_hit=0.05,
            kernel="nccl_ring_allreduce",
            fallback_kernel="nccl_tree_allreduce",
        )
    return Workload(
        name=name,
        mode=mode,
        layers=layers,
        params=params,
        tokens_per_step=float(seq * micro_batch) if train else 0.0,
        micro_batch=float(micro_batch),
        gen_tokens=float(gen),
        tokens_per_seq=1.0 + prompt / gen,
        max_batch=float(max_batch),
        tick_s=tick_s,
        comm_bytes_tok=comm_tok,
        comm_bytes_step=comm_step,
    )


def resnet50(name: str, *, mode: Mode, batch: int = 256, tick_s: float = 0.02) -> Workload:
    """Lower ResNet-50 (224x224 images; one image is one "token") to layer costs."""
    train = mode == "train"
    pm = 3.0 if train else 1.0
    conv_flops = 8.1e9 * pm  # 4.05 GMAC per image forward
    # inference folds batch-norm into the convs and fuses ReLU / residual adds into epilogues
    norm_elems = 11.0e6 if train else 1.0e6
    other_elems = 12.0e6 if train else 3.0e6
    layers: dict[str, LayerCost] = {
        "conv": LayerCost(
            flops_tok=conv_flops,
            weight_bytes=BF16 * 23.5e6 * pm,
            act_bytes_tok=BF16 * 9.0e6 * pm,
            reuse_bytes_tok=BF16 * 6.0e6 * pm,
            kernels=53 * pm,
            eff_compute=0.62,
            eff_mem=0.85,
            occupancy=0.5,
            sram_hit=0.75,
            kernel="cudnn_conv_implicit_gemm",
            fallback_kernel="cudnn_conv_fft",
        ),
        "norm": LayerCost(
            flops_tok=8.0 * norm_elems * pm,
            act_bytes_tok=BF16 * 2 * norm_elems * pm,
            kernels=53 * pm if train else 4.0,
            eff_compute=0.3,
            eff_mem=0.8,
            occupancy=0.85,
            sram_hit=0.3,
            kernel="batchnorm_fused",
            fallback_kernel="batchnorm_eager",
        ),
        "mlp": LayerCost(
            flops_tok=2.0 * 2048 * 1000 * pm,
            weight_bytes=BF16 * 2048 * 1000 * pm,
            act_bytes_tok=BF16 * 3048 * pm,
            kernels=pm,
            eff_compute=0.6,
            eff_mem=0.85,
            occupancy=0.5,
            sram_hit=0.8,
            kernel="cublas_gemm_fc",
            fallback_kernel="cublas_gemm_default",
        ),
        "other": LayerCost(
            flops_tok=0.25 * other_elems * pm,
            act_bytes_tok=BF16 * 2 * other_elems * pm,
            kernels=40 * pm if train else 8.0,
            eff_compute=0.3,
            eff_mem=0.8,
            occupancy=0.8,
            sram_hit=0.3,
            kernel="relu_add_pool_fused",
            fallback_kernel="relu_add_pool_eager",
        ),
    }
    params = 25.6e6
    if train:
        layers["allreduce"] = LayerCost(
            flops_tok=0.0,
            kernels=4.0,
            eff_compute=1.0,
            eff_mem=1.0,
            occupancy=0.12,
            sram_hit=0.05,
            kernel="nccl_ring_allreduce",
            fallback_kernel="nccl_tree_allreduce",
        )
    return Workload(
        name=name,
        mode=mode,
        layers=layers,
        params=params,
        tokens_per_step=float(batch) if train else 0.0,
        micro_batch=float(batch),
        gen_tokens=1.0,
        tokens_per_seq=1.0,
        max_batch=float(batch),
        tick_s=tick_s,
        comm_bytes_step=BF16 * params if train else 0.0,
        quality=0.955,
    )


LLAMA_8B = {"d": 4096, "n_layers": 32, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256}


def _build() -> dict[str, Workload]:
    llama8 = LLAMA_8B
    llama70 = {"d": 8192, "n_layers": 80, "heads": 64, "kv_heads": 8, "ffn": 28672, "vocab": 128256}
    mixtral = {"d": 4096, "n_layers": 32, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 32000}
    return {
        "llama-70b/train": dense_llm("llama-70b", mode="train", tp=8, seq=8192, **llama70),
        "llama-8b/train": dense_llm(
            "llama-8b", mode="train", tp=1, seq=8192, micro_batch=2, **llama8
        ),
        "llama-8b/serve": dense_llm(
            "llama-8b", mode="serve", prompt=512, gen=256, max_batch=256, tick_s=0.05, **llama8
        ),
        "llama-70b/serve": dense_llm(
            "llama-70b",
            mode="serve",
            tp=8,
            prompt=1024,
            gen=256,
            max_batch=256,
            tick_s=0.08,
            **llama70,
        ),
        "mixtral-8x7b/serve": dense_llm(
            "mixtral-8x7b",
            mode="serve",
            tp=2,
            prompt=512,
            gen=256,
            max_batch=256,
            tick_s=0.06,
            experts=8,
            top_k=2,
            **mixtral,
        ),
        "mixtral-8x7b/train": dense_llm(
            "mixtral-8x7b",
            mode="train",
            tp=2,
            seq=4096,
            micro_batch=2,
            experts=8,
            top_k=2,
            **mixtral,
        ),
        "resnet-50/serve": resnet50("resnet-50", mode="serve", batch=512, tick_s=0.01),
        "resnet-50/train": resnet50("resnet-50", mode="train", batch=256),
    }


WORKLOADS: dict[str, Workload] = _build()
