"""Hardware catalog: dense peaks with sources; config extends it; unknown keys give no MFU."""

from __future__ import annotations

import pytest

from monitor.config import Settings
from monitor.core.pipeline import catalog_from
from monitor.hardware import DEFAULT_CATALOG, Catalog


def test_every_entry_has_bf16_peak_bandwidth_and_source() -> None:
    """All seven catalog entries carry a dense bf16 peak, HBM bandwidth and a source."""
    assert set(DEFAULT_CATALOG) == {"a100-sxm", "h100-sxm", "h200", "b200", "mi300x",
                                    "tpu-v5e", "tpu-v5p"}  # fmt: skip
    for spec in DEFAULT_CATALOG.values():
        assert spec.peak("bf16")
        assert spec.hbm_bytes_per_s > 0
        assert spec.source


@pytest.mark.parametrize(
    ("hw", "tflops"),
    [("h100-sxm", 989.4), ("h200", 989.4), ("a100-sxm", 312.0), ("b200", 2250.0),
     ("mi300x", 1307.4), ("tpu-v5e", 197.0), ("tpu-v5p", 459.0)],
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
