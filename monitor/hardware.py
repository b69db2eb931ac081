"""Hardware catalog: dense peak FLOP/s per dtype and HBM bandwidth, with sources.

Peaks are *dense* figures; vendor sheets often print the 2:4-sparsity number,
which is twice as large and would halve every MFU we report. The catalog is data:
deployments extend or override it from config (`hardware` table), never in code.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

TERA = 1e12


class HardwareSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Peak dense FLOP/s per dtype, HBM bandwidth (bytes/s) and where the figures come from."""

    peak_flops: dict[str, float]
    hbm_bytes_per_s: float
    source: str
    # Boost clock the peaks assume; lets clock-throttling be read as a share of peak.
    max_clock_mhz: float | None = None

    def peak(self, dtype: str | None) -> float | None:
        """Dense peak FLOP/s for `dtype` (bf16 when unset), or None when the dtype is unknown."""
        return self.peak_flops.get((dtype or "bf16").lower())


def _tf(**per_dtype: float) -> dict[str, float]:
    return {k: v * TERA for k, v in per_dtype.items()}


DEFAULT_CATALOG: dict[str, HardwareSpec] = {
    "a100-sxm": HardwareSpec(
        peak_flops=_tf(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
        hbm_bytes_per_s=2.039e12,
        max_clock_mhz=1410.0,
        source="NVIDIA A100 datasheet (80 GB SXM), dense; via astroC86/gpu-datasheet README",
    ),
    "h100-sxm": HardwareSpec(
        peak_flops=_tf(bf16=989.4, fp16=989.4, fp8=1978.9, tf32=494.7, fp32=66.9),
        hbm_bytes_per_s=3.35e12,
        max_clock_mhz=1980.0,
        source="NVIDIA H100 SXM datasheet, dense (1,979 BF16 is with sparsity); "
        "glennklockwood.com/garden/processors/h100",
    ),
    "h200": HardwareSpec(
        peak_flops=_tf(bf16=989.4, fp16=989.4, fp8=1978.9, tf32=494.7, fp32=66.9),
        hbm_bytes_per_s=4.8e12,
        max_clock_mhz=1980.0,
        source="NVIDIA H200 SXM (same SMs as H100 SXM, 4.8 TB/s HBM3e); aiwiki.ai/wiki/nvidia_h200",
    ),
    "b200": HardwareSpec(
        peak_flops=_tf(bf16=2250.0, fp16=2250.0, fp8=4500.0),
        hbm_bytes_per_s=8.0e12,
        source="NVIDIA HGX B200 1000 W, dense; glennklockwood.com/garden/processors/B200",
    ),
    "mi300x": HardwareSpec(
        peak_flops=_tf(bf16=1307.4, fp16=1307.4, fp8=2614.9),
        hbm_bytes_per_s=5.3e12,
        source="AMD MI300X datasheet, dense; alpharomercoma/MI300X-vs-H200 METHODOLOGY.md",
    ),
    "a800": HardwareSpec(
        peak_flops=_tf(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
        hbm_bytes_per_s=2.039e12,
        max_clock_mhz=1410.0,
        source="NVIDIA A800 80 GB SXM: A100 silicon, NVLink cut to 400 GB/s; dense "
        "(311.87 BF16, 155.94 TF32 tensor, 19.49 FP32); "
        "https://hmc-tech.com/gpu/nvidia-a800-vs-nvidia-t40",
    ),
    "v100": HardwareSpec(
        # Volta tensor cores take fp16 only: no bf16 or tf32 peak, so those get no MFU.
        peak_flops=_tf(fp16=125.0, fp32=15.7, fp64=7.8),
        hbm_bytes_per_s=900e9,
        max_clock_mhz=1530.0,
        source="NVIDIA Tesla V100 SXM2 datasheet: 125 tensor TFLOPS (fp16), 15.7 FP32, "
        "900 GB/s HBM2; https://developer.nvidia.com/programming-tensor-cores-cuda-9-0",
    ),
    "t4": HardwareSpec(
        peak_flops=_tf(fp16=65.0, int8=130.0, fp32=8.1),
        hbm_bytes_per_s=320e9,
        max_clock_mhz=1590.0,
        source="NVIDIA T4 datasheet: 65 FP16 tensor TFLOPS, 130 INT8 TOPS, 8.1 FP32, "
        "320 GB/s GDDR6; https://sysrqmts.com/en/gpus/nvidia/tesla/t4",
    ),
    "l40s": HardwareSpec(
        peak_flops=_tf(bf16=362.05, fp16=362.05, fp8=733.0, tf32=183.0, fp32=91.6),
        hbm_bytes_per_s=864e9,
        max_clock_mhz=2520.0,
        source="NVIDIA L40S datasheet, dense (733 BF16 / 366 TF32 are with sparsity), "
        "864 GB/s GDDR6; https://www.mullet.se/product.html?product_id=355414",
    ),
    # ROCm, PyTorch and the exporters see each of an MI250(X)'s two GCDs as one device:
    # these entries are per GCD, half of the OAM package's figures.
    "mi250x": HardwareSpec(
        peak_flops=_tf(bf16=191.5, fp16=191.5, fp32=47.85, fp64=47.85),
        hbm_bytes_per_s=1.6e12,
        max_clock_mhz=1700.0,
        source="AMD Instinct MI250X, per GCD (package: 383 BF16/FP16 matrix, 95.7 FP32/FP64 "
        "matrix, 3.2 TB/s); https://yobitel.com/knowledge-base/amd-mi250",
    ),
    "mi250": HardwareSpec(
        peak_flops=_tf(bf16=181.05, fp16=181.05, fp32=45.25, fp64=45.25),
        hbm_bytes_per_s=1.6e12,
        max_clock_mhz=1700.0,
        source="AMD Instinct MI250, per GCD (package: 362.1 BF16/FP16 matrix, 90.5 FP32/FP64 "
        "matrix, 3.2 TB/s); https://yobitel.com/knowledge-base/amd-mi250",
    ),
    "tpu-v5e": HardwareSpec(
        peak_flops=_tf(bf16=197.0, int8=394.0),
        hbm_bytes_per_s=819e9,
        source="Google Cloud TPU v5e docs (docs.cloud.google.com/tpu/docs/v5e)",
    ),
    "tpu-v5p": HardwareSpec(
        peak_flops=_tf(bf16=459.0, int8=918.0),
        hbm_bytes_per_s=2765e9,
        source="Google Cloud TPU v5p docs (cloud.google.com/tpu/docs/v5p-training)",
    ),
}


class Catalog:
    """Lookup of hardware specs by `hw` key; extended or overridden from config."""

    def __init__(self, extra: Mapping[str, HardwareSpec] | None = None) -> None:
        self._specs: dict[str, HardwareSpec] = dict(DEFAULT_CATALOG)
        if extra:
            self._specs.update({k.lower(): v for k, v in extra.items()})

    def get(self, hw: str | None) -> HardwareSpec | None:
        """The spec for `hw`, or None when the key is unknown (MFU is then not computed)."""
        if hw is None:
            return None
        return self._specs.get(hw.lower())

    def peak_flops(self, hw: str | None, dtype: str | None) -> float | None:
        """Dense peak FLOP/s for (hw, dtype), or None when either is unknown."""
        spec = self.get(hw)
        return None if spec is None else spec.peak(dtype)

    def keys(self) -> list[str]:
        """Known hardware keys, sorted."""
        return sorted(self._specs)
