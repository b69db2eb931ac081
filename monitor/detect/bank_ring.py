"""The value ring in half precision: each cell's samples as float16 offsets from an anchor.

A cell's ring holds `(x - anchor) / unit` as float16, with the anchor (float32) and the
unit (a power of two, float32) per cell. Half the bytes of float32 samples, and no
coarser where it matters:

- an offset keeps 11 significant bits, so a sample k scales from its anchor is held to
  k / 2048 of a scale;
- an offset under float16's normal range is held to 2^-25 units, and the unit is at most
  twice max(|anchor|, scale): near its anchor a sample is held to 2^-24 of the larger of
  its level and scale, float32's rounding (`REL_FLOOR_MIN` is its step);
- the unit makes room for offsets of up to `REACH` units; a sample farther from its
  anchor widens the unit about the same anchor (`BankCusum._refit`), and the baseline
  and each alarm re-anchor a cell on its new level.

A decoded value encodes back to the same offset: a power-of-two unit times an 11-bit
offset, plus a float32 anchor, loses at most bits far below the offset's last one.
"""

from __future__ import annotations

import numpy as np

from monitor.arrays import F32, F64

RING_DTYPE = np.float16
# Offsets are kept under this many units (float16 holds 65504): a sample farther from
# its anchor widens its cell's unit.
REACH = float(1 << 15)
# A cell whose first sample is 0 has no magnitude to size its unit by: the smallest unit
# makes its first non-zero sample widen it (`BankCusum._refit`).
_E_MIN, _E_MAX = -100, 127  # float32 holds 2^127


def unit_for(mag: F64) -> F32:
    """The power of two at or above each magnitude (the smallest unit where it is 0)."""
    mag = np.asarray(mag, dtype=np.float64)
    _, e = np.frexp(np.where(np.isfinite(mag), mag, 1.0))
    e = np.where(mag > 0, e, _E_MIN)
    unit: F32 = np.ldexp(np.float32(1.0), np.clip(e, _E_MIN, _E_MAX)).astype(np.float32)
    return unit


def unit_holding(anchor: F64, scale: F64 | float, spread: F64 | float) -> F32:
    """A unit sized by the anchor's magnitude and a scale, with room for offsets up to
    `spread` (the farthest sample it must hold)."""
    mag = np.maximum(np.maximum(np.abs(anchor), scale), np.nan_to_num(spread) / (REACH / 2))
    return unit_for(mag)


def unit_for_ring(vals: F64, anchor: F32 | F64, scale: F64 | float) -> F32:
    """`unit_holding` with room for every sample of `vals` (one column per cell; NaN for
    an empty slot) about its cell's anchor."""
    spread = np.fmax.reduce(np.abs(vals - anchor), axis=0) if vals.shape[0] else 0.0
    return unit_holding(np.asarray(anchor, dtype=np.float64), scale, spread)


def offsets(x: F64, anchor: F32 | F64, unit: F32 | F64) -> F64:
    """Samples as offsets from their anchors, in units (float64; the ring casts them)."""
    d: F64 = (x - anchor) / unit
    return d


def beyond_reach(d: F64) -> bool:
    """Whether any offset is too far from its anchor for float16 (NaN offsets are not)."""
    return bool(d.size) and float(np.fmax.reduce(np.abs(d), axis=None)) >= REACH


def decode(q: np.ndarray, anchor: F32 | F64, unit: F32 | F64) -> F64:
    """Ring offsets back to samples (NaN stays NaN)."""
    out: F64 = q.astype(np.float64) * unit + anchor
    return out


def encode(x: F64, anchor: F32 | F64, unit: F32 | F64) -> np.ndarray:
    """Samples as ring offsets (NaN stays NaN)."""
    return offsets(x, anchor, unit).astype(RING_DTYPE)
