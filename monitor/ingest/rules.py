"""The tables ingest names things by: layer types, hardware aliases, precisions, kernel kinds.

Every table is data. Users extend the layer rules and hardware aliases from config
(`[ingest]`); their rows are tried before the built-in ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from monitor.config import IngestSettings, LayerRule

# Layer-type rules, by field. A kernel's type comes from its nn.Module scope first
# (innermost module that any module rule names), then from its operator chain (innermost
# op any op rule names), then from the kernel's own name. Collective kernels are the
# exception that comes first: an all-reduce launched inside an MLP is still a collective.
_FIRST: tuple[tuple[str, str], ...] = (
    (r"nccl|rccl|ncclDevKernel|cross_device_reduce|all_reduce|allreduce", "allreduce"),
)
_MODULE: tuple[tuple[str, str], ...] = (
    (r"router|moegate|topkgate", "moe_router"),
    (r"attention|attn|selfattn|multihead", "attention"),
    (r"mlp|feedforward|ffn|intermediate|moe|expert", "mlp"),
    (r"norm", "norm"),
    (r"embedding", "embedding"),
    (r"conv", "conv"),
    (r"softmax", "softmax"),
)
_OP: tuple[tuple[str, str], ...] = (
    (r"^(c10d::|nccl:|gloo:|record_param_comms)", "allreduce"),
    (r"scaled_dot_product|ScaledDotProduct|flash_attention|FlashAttention|efficient_attention|"
     r"EfficientAttention|multi_head_attention", "attention"),
    (r"softmax|SoftmaxBackward", "softmax"),
    (r"norm|NormBackward", "norm"),
    (r"embedding|EmbeddingBackward", "embedding"),
    (r"conv|Convolution", "conv"),
    (r"^aten::(linear|addmm|mm|matmul|_addmm_activation)$|^(Addmm|Mm|Linear)Backward", "mlp"),
)  # fmt: skip
_FUSED = r"flash|fmha|attn_fwd|attn_bwd|efficient_attention|paged_attention|mha_fwd|mha_bwd"
_KERNEL: tuple[tuple[str, str], ...] = (
    (_FUSED, "attention"),
    (r"softmax", "softmax"),
    (r"layer_norm|layernorm|rms_?norm|batch_norm|bn_fw|bn_bw|group_norm|_norm_", "norm"),
    (r"embedding", "embedding"),
    (r"conv|scudnn|fprop|dgrad|wgrad|igemm_(fwd|bwd|wrw)", "conv"),
    (r"(?<!fb)gemm|Cijk_|xmma|gemv|cutlass", "mlp"),
)  # fmt: skip
_FIELDS = ("first", "module", "op", "kernel")
_BUILTIN = {"first": _FIRST, "module": _MODULE, "op": _OP, "kernel": _KERNEL}

# Device name -> hardware catalog key. Matched against "NAME (N SMs)" when the trace
# gives the SM count, so that a generic name (ROCm 6 reports MI250 GCDs as "AMD Radeon
# Graphics") still resolves by its compute-unit count.
_HW_ALIASES: tuple[tuple[str, str], ...] = (
    (r"H100.*(SXM|HBM3)", "h100-sxm"),
    (r"H200", "h200"),
    (r"B200", "b200"),
    (r"A800", "a800"),
    (r"A100", "a100-sxm"),
    (r"V100", "v100"),
    (r"L40S", "l40s"),
    (r"\bT4\b", "t4"),
    (r"MI300X", "mi300x"),
    (r"MI250X|AMD Radeon Graphics \(110 SMs\)", "mi250x"),
    (r"MI250|AMD Radeon Graphics \(104 SMs\)", "mi250"),
)

# Tensor element types as PyTorch's profiler spells them -> catalog precision keys.
_DTYPES = {
    "c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "signed char": "int8",
}  # fmt: skip

# Kernel kinds. TF32: cutlass `tensorop_s1688gemm` (fp32 in, TF32 mma), cuBLAS/cuDNN
# `xmma_*tf32*`; bf16/fp16 cutlass kernels spell their type (`tensorop_bf16_s16816gemm`).
TF32_KERNEL = re.compile(r"tf32|tensorop_s\d{4,5}(?:gemm|fprop|dgrad|wgrad)", re.IGNORECASE)
# GEMMs and convolutions off the tensor cores: SIMT single/double precision (`volta_sgemm`,
# `implicit_convolve_sgemm`, `volta_scudnn`), GEMV and small-N fallbacks.
SIMT_GEMM = re.compile(r"sgemm|dgemm|gemv|gemmSN|scudnn|gcgemm", re.IGNORECASE)
GEMM_LIKE = re.compile(
    r"(?<!fb)gemm|Cijk_|xmma|cutlass|scudnn|cudnn.*(conv|fprop|dgrad|wgrad)|igemm|wmma|mfma|"
    r"conv2d|convolve|fprop|dgrad|wgrad",
    re.IGNORECASE,
)
FUSED_ATTENTION = re.compile(_FUSED, re.IGNORECASE)
SOFTMAX = re.compile(r"softmax", re.IGNORECASE)
COLLECTIVE = re.compile(_FIRST[0][0], re.IGNORECASE)
# Ops whose GEMMs multiply two activations: in an attention layer, the unfused core.
BATCHED_ACTIVATION_GEMM = re.compile(r"^aten::(bmm|baddbmm)$|^(Bmm|Baddbmm)Backward")


def dtype_of(type_name: str | None) -> str | None:
    """Catalog precision key for a profiler `Input type` entry, or None."""
    return _DTYPES.get(type_name or "")


@dataclass(frozen=True, slots=True)
class LayerRules:
    """The compiled rules table, asked in order: `by_kernel_first`, `by_scope` (module
    scope, innermost first, then the op chain), `by_kernel`; "other" when none answers."""

    tiers: tuple[tuple[tuple[re.Pattern[str], str], ...], ...]

    @classmethod
    def build(cls, extra: Sequence[LayerRule] = ()) -> LayerRules:
        """Built-in rules with `extra` rows (config) tried first within their field."""
        tiers = []
        for name in _FIELDS:
            user = [(r.pattern, r.type) for r in extra if r.field == name]
            rows = [*user, *_BUILTIN[name]]
            tiers.append(tuple((re.compile(p, re.IGNORECASE), t) for p, t in rows))
        return cls(tuple(tiers))

    @staticmethod
    def _first(rules: Iterable[tuple[re.Pattern[str], str]], names: Iterable[str]) -> str | None:
        rows = tuple(rules)
        for name in names:
            for pattern, layer in rows:
                if pattern.search(name):
                    return layer
        return None

    def by_kernel_first(self, kernel: str) -> str | None:
        """The rules that outrank scope (collectives), on the kernel name."""
        return self._first(self.tiers[0], (kernel,))

    def by_scope(self, modules: Sequence[str], ops: Sequence[str]) -> str | None:
        """Module rules on the module scope, then op rules on the op chain."""
        return self._first(self.tiers[1], modules) or self._first(self.tiers[2], ops)

    def by_kernel(self, kernel: str) -> str | None:
        """Kernel-name rules: what types a kernel no scope or op names."""
        return self._first(self.tiers[3], (kernel,))


class HwAliases:
    """Device name -> hardware catalog key through the alias table (config rows first)."""

    def __init__(self, extra: Mapping[str, str] | None = None) -> None:
        rows = [*(extra or {}).items(), *_HW_ALIASES]
        self._rows = [(re.compile(p, re.IGNORECASE), hw) for p, hw in rows]

    def resolve(self, name: str | None, sms: int | None = None) -> str | None:
        """The catalog key for a device name (and SM/CU count when known), or None."""
        if not name:
            return None
        text = f"{name} ({sms} SMs)" if sms else name
        return next((hw for pattern, hw in self._rows if pattern.search(text)), None)


def from_settings(ingest: IngestSettings) -> tuple[LayerRules, HwAliases]:
    """The rules and aliases a process uses: built-ins extended by `[ingest]`."""
    return LayerRules.build(ingest.layer_rules), HwAliases(ingest.hw_aliases)


_WRAPPER = re.compile(r"(^|::)Kernel2?$")


def short_kernel_name(name: str, limit: int = 256) -> str:
    """A kernel's identity without its argument list or template noise.

    `void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1>(...)` names
    its kernel in the template argument; `at::native::elementwise_kernel<128, 4, ...>` in
    its base name.
    """
    text = name.removeprefix("void ").replace("(anonymous namespace)::", "").strip()
    depth, cut_args, cut_tmpl = 0, len(text), None
    for i, ch in enumerate(text):
        if ch == "<":
            if depth == 0 and cut_tmpl is None:
                cut_tmpl = i
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut_args = i
            break
    head = text[:cut_args]
    base = head[:cut_tmpl] if cut_tmpl is not None else head
    if cut_tmpl is not None and _WRAPPER.search(base):
        inner = head[cut_tmpl + 1 :].rsplit(">", 1)[0]
        base = inner.split(",")[0].strip() or base
    return base[:limit] or name[:limit]
