"""Hardware catalog: dense peaks with sources; config extends it; unknown keys give no MFU."""

from __future__ import annotations

import pytest

from monitor.config import Settings, catalog_from
from monitor.hardware import DEFAULT_CATALOG, Catalog


def test_every_entry_has_a_peak_bandwidth_and_source() -> None:
    """Every entry carries dense peaks, memory bandwidth and a source; all but the chips
    without bf16 units (V100, T4: fp16 tensor cores only) have a bf16 peak."""
    assert set(DEFAULT_CATALOG) == {"a100-sxm", "h100-sxm", "h200", "b200", "mi300x",
                                    "tpu-v5e", "tpu-v5p", "a800", "v100", "t4", "l40s",
                                    "mi250x", "mi250"}  # fmt: skip
    for key, spec in DEFAULT_CATALOG.items():
        assert spec.peak_flops
        assert spec.hbm_bytes_per_s > 0
        assert spec.source
        assert (spec.peak("bf16") is None) == (key in {"v100", "t4"})


def test_tf32_peaks_sit_between_fp32_and_bf16() -> None:
    """Where a chip has TF32 tensor cores, its dense TF32 peak is half the bf16 one and
    above the fp32 one: an fp32 model on TF32 GEMMs is judged at TF32, never at fp32."""
    for key in ("a100-sxm", "a800", "h100-sxm", "h200", "l40s"):
        spec = DEFAULT_CATALOG[key]
        tf32, bf16, fp32 = spec.peak("tf32"), spec.peak("bf16"), spec.peak("fp32")
        assert tf32 is not None
        assert bf16 is not None
        assert fp32 is not None
        assert fp32 < tf32
        assert tf32 == pytest.approx(bf16 / 2, rel=0.02)


def test_mi250_entries_are_per_gcd() -> None:
    """ROCm shows each MI250(X) GCD as a device: the entries hold half a package."""
    assert Catalog().peak_flops("mi250x", "bf16") == pytest.approx(383e12 / 2)
    assert Catalog().peak_flops("mi250", "bf16") == pytest.approx(362.1e12 / 2)


@pytest.mark.parametrize(
    ("hw", "tflops"),
    [("h100-sxm", 989.4), ("h200", 989.4), ("a100-sxm", 312.0), ("b200", 2250.0),
     ("mi300x", 1307.4), ("tpu-v5e", 197.0), ("tpu-v5p", 459.0), ("a800", 312.0),
     ("l40s", 362.05)],
)  # fmt: skip
def test_dense_not_sparse_peaks(hw: str, tflops: float) -> None:
    """Peaks are the dense figures (the sparsity numbers would be twice these)."""
    assert Catalog().peak_flops(hw, "bf16") == pytest.approx(tflops * 1e12)


def test_lookup_is_case_insensitive_and_unknown_is_none() -> None:
    """Unknown hw or dtype yields None (MFU not computed), never an exception."""
    cat = Catalog()
    assert cat.peak_flops("H100-SXM", "BF16") == pytest.approx(989.4e12)
    assert cat.peak_flops("mystery", "bf16") is None
    assert cat.peak_flops("h100-sxm", "fp4") is None
    assert cat.peak_flops(None, None) is None


def test_config_adds_and_overrides_entries() -> None:
    """A [hardware.<key>] table adds a new chip or replaces a default one."""
    settings = Settings.model_validate({"hardware": {
        "gaudi3": {"peak_flops": {"bf16": 1835e12}, "hbm_bytes_per_s": 3.7e12},
        "h100-sxm": {"peak_flops": {"bf16": 900e12}, "hbm_bytes_per_s": 3.35e12},
    }})  # fmt: skip
    cat = catalog_from(settings)
    assert cat.peak_flops("gaudi3", "bf16") == 1835e12
    assert cat.peak_flops("h100-sxm", "bf16") == 900e12
    assert cat.peak_flops("h200", "bf16") == pytest.approx(989.4e12)
