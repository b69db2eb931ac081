"""Which stages of the execution flow a device's records let the monitor judge.

Contract §3 names the indicators of each stage. A device that never sends any of a
stage's fields cannot show that stage failing: a dcgm-exporter sidecar sends one layer
`all` with device counters (no kernel names, no per-layer split, no SRAM hits or
spills), so lowering and scheduling go unseen on it; a profiler trace has no request
queue and no SLO. An alert names such stages (`Alert.not_judged`) instead of implying
they were checked and found healthy.

Each device carries a bit mask of the fields its newest window record had
(`StreamTable.device_fields`); a stage is judged on a device when one of its
alternatives (a field, or a pair that makes a ratio) is all there.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from monitor.arrays import F64, I64, Bools
from monitor.indicators import DEVICE_METRICS, LAYER_INPUTS
from monitor.wire import STAGES, NotJudged, Stage

# One bit per measured field: the layer counters (any layer, `all` included), the kernel
# name, arithmetic intensity on a typed layer, and the device-level fields (the device
# matrix's columns after device MFU, which is derived).
_FIELDS: tuple[str, ...] = (
    *(f"layers[].{name}" for name in LAYER_INPUTS),
    "layers[].kernel",
    "typed_intensity",
    *DEVICE_METRICS[1:],
)
BIT: dict[str, int] = {name: 1 << i for i, name in enumerate(_FIELDS)}
# Weights that turn an isfinite matrix into masks (column order of LAYER_INPUTS / the
# device matrix less device MFU).
# Sums of distinct powers of two are ORs; float64 holds them exactly (below 2**53), and a
# float matmul is BLAS where an integer one is a plain loop.
LAYER_BITS = np.array([BIT[f"layers[].{n}"] for n in LAYER_INPUTS], dtype=np.float64)
DEVICE_BITS = np.array([BIT[n] for n in DEVICE_METRICS[1:]], dtype=np.float64)
KERNEL_BIT = BIT["layers[].kernel"]
TYPED_INTENSITY_BIT = BIT["typed_intensity"]
_FLOPS = LAYER_INPUTS.index("flops")
_BYTES = LAYER_INPUTS.index("bytes_hbm")

_DEVICE_FIELD = {
    "clock_mhz": "device_stats.clock_mhz", "temp_c": "device_stats.temp_c",
    "power_w": "device_stats.power_w", "req_rate": "ingress.req_rate",
    "queue_depth": "ingress.queue_depth", "queue_wait_ms": "ingress.queue_wait_ms",
    "batch": "ingress.batch", "lat_p50_ms": "slo.lat_p50_ms", "lat_p95_ms": "slo.lat_p95_ms",
    "lat_p99_ms": "slo.lat_p99_ms", "quality": "slo.quality",
    "error_rate": "slo.errors/ingress.req_rate",  # a rate per request needs both
}  # fmt: skip


def _alt(*fields: str) -> tuple[str, int]:
    """One way to judge a stage: these fields together (a ratio needs both of its parts),
    named as the contract names them."""
    mask = 0
    for f in fields:
        mask |= BIT[f]
    words = [_DEVICE_FIELD.get(f, f) for f in fields]
    if fields == ("typed_intensity",):
        words = ["layers[].flops+bytes_hbm per layer type"]
    return "+".join(words).replace("+layers[].", "+"), mask


# Contract §3, stage by stage: the alternatives, any one of which lets the stage be
# judged. Arithmetic intensity counts only on a typed layer (`_PER_LAYER_ONLY`). Release
# is the monitor's own alerts and change events: always there.
STAGE_FIELDS: dict[Stage, tuple[tuple[str, int], ...]] = {
    "ingress": tuple(_alt(f) for f in ("req_rate", "queue_depth", "queue_wait_ms", "batch")),
    "lowering": (_alt("layers[].kernel"), _alt("layers[].fallback_frac")),
    "scheduling": (
        _alt("layers[].sram_hit"), _alt("layers[].spill_bytes"), _alt("typed_intensity"),
    ),
    "execution": (
        _alt("layers[].flops", "layers[].busy_s"),
        _alt("layers[].stall_mem_cycles", "layers[].cycles"),
        _alt("layers[].occupancy"),
        _alt("layers[].sync_wait_s", "layers[].busy_s"),
        _alt("clock_mhz"), _alt("temp_c"), _alt("power_w"),
    ),
    "validation": tuple(
        _alt(f) for f in ("lat_p50_ms", "lat_p95_ms", "lat_p99_ms", "quality", "error_rate")
    ),
}  # fmt: skip

# Indicators that speak for their stage only per layer type. Arithmetic intensity on
# `all` mixes every layer's intensity, so it moves with the workload's mix as much as
# with tiling and placement (and dcgm-exporter's FLOPs are an estimate from tensor-pipe
# activity): a whole-device FLOPs-per-byte drop is what the devices executed, not
# scheduling evidence.
_PER_LAYER_ONLY = frozenset({"arith_intensity"})
COARSE_LAYER = "all"


def stage_of(metric: str, layer: str | None, stage: Stage) -> Stage:
    """The stage a change of `metric` on `layer` is evidence of: its own (`STAGE_OF`),
    except a per-layer-only indicator on the whole-device layer `all`, which is execution."""
    if layer == COARSE_LAYER and metric in _PER_LAYER_ONLY:
        return "execution"
    return stage


def record_masks(
    layer_raw: F64,
    layer_typed: Bools,
    layer_kernel: I64,
    layer_record: I64,
    device_raw: F64,
) -> I64:
    """Per window record, the mask of the fields it carried (vectorised over a batch).

    `layer_raw` (n, len(LAYER_INPUTS)) and `layer_typed` (n,) per layer, `layer_kernel`
    the positions of layers with a kernel name, `layer_record` each layer's record index;
    `device_raw` (m, len(DEVICE_METRICS) - 1) per record.
    """
    out = (np.isfinite(device_raw) @ DEVICE_BITS).astype(np.int64)
    if layer_raw.shape[0]:
        ok = np.isfinite(layer_raw)
        bits = (ok @ LAYER_BITS).astype(np.int64)
        bits[layer_kernel] |= KERNEL_BIT
        bits[ok[:, _FLOPS] & ok[:, _BYTES] & layer_typed] |= TYPED_INTENSITY_BIT
        # Each record's layers are contiguous: OR them per run, not one `ufunc.at` per layer.
        starts = np.flatnonzero(np.r_[True, layer_record[1:] != layer_record[:-1]])
        out[layer_record[starts]] |= np.bitwise_or.reduceat(bits, starts)
    return out


def judged(stage: Stage, mask: int) -> bool:
    """Whether a device whose records carry `mask` lets `stage` be judged."""
    alts = STAGE_FIELDS.get(stage)
    return alts is None or any(mask & m == m for _, m in alts)


def not_judged(masks: Iterable[int]) -> list[NotJudged]:
    """Per stage, in flow order: the fields none of these devices' records carried, and on
    how many of the devices (stages judged on every device are left out)."""
    masks = list(masks)
    out = []
    for stage in STAGES:
        blind = sum(not judged(stage, m) for m in masks)
        if blind:
            missing = [name for name, _ in STAGE_FIELDS[stage]]
            out.append(NotJudged(stage=stage, devices=blind, missing=missing))
    return out


def where(item: NotJudged, device_count: int) -> str:
    """'' when a stage went unjudged on every device of an alert, else ' on N of M devices'."""
    return "" if item.devices >= device_count else f" on {item.devices} of {device_count} devices"


def describe(items: Iterable[NotJudged], device_count: int) -> str:
    """One line for people: each stage not judged, where, and the fields that were missing."""
    return "; ".join(
        f"{i.stage}{where(i, device_count)} (no {', '.join(i.missing)})" for i in items
    )
