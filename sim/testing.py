"""Test helpers: decode a run with the monitor codec and read indicators back from the records."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from monitor.arrays import F64
from monitor.hardware import Catalog
from monitor.wire import Codec, Layer, WindowRecord
from sim.labels import MEAN_OF
from sim.run import Simulation

CATALOG = Catalog()
CODEC = Codec()


@dataclass
class Decoded:
    """Decoded window records of a run, grouped by window ts, plus the change events."""

    ts: list[float] = field(default_factory=list)
    records: dict[float, list[WindowRecord]] = field(default_factory=lambda: defaultdict(list))
    changes: list[tuple[float, bytes, bytes]] = field(
        default_factory=list
    )  # (window ts, key, json)


def decode_run(sim: Simulation) -> Decoded:
    """Decode every record of the run with the monitor's codec (raises DecodeError on any)."""
    out = Decoded()
    for w in sim.windows():
        out.ts.append(w.ts)
        for key, value in w.records:
            rec = CODEC.decode_window(value)
            if rec.device.encode() != key:
                raise ValueError(f"key {key!r} is not the device {rec.device!r}")
            out.records[w.ts].append(rec)
        for key, value in w.changes:
            CODEC.decode_change(value)
            out.changes.append((w.ts, key, value))
    return out


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


def layer_indicator(rec: WindowRecord, lay: Layer, name: str) -> float | None:
    """Indicator `name` of one layer of a record, derived as contract §1 defines it."""
    match name:
        case "mfu":
            peak = CATALOG.peak_flops(rec.hw, rec.dtype)
            return _ratio(
                lay.flops, None if lay.busy_s is None or peak is None else lay.busy_s * peak
            )
        case "stall_frac":
            return _ratio(lay.stall_mem_cycles, lay.cycles)
        case "intensity":
            return _ratio(lay.flops, lay.bytes_hbm)
        case "sync_frac":
            return _ratio(lay.sync_wait_s, lay.busy_s)
        case "occupancy" | "sram_hit" | "fallback_frac" | "spill_bytes":
            val = getattr(lay, name)
            return None if val is None else float(val)
    raise KeyError(name)


def indicator(rec: WindowRecord, name: str, layer: str | None) -> float | None:
    """Indicator `name` (of `layer`, or device-level when None) of one record; None if absent."""
    if layer is not None:
        lay = next((x for x in rec.layers if x.type == layer), None)
        return None if lay is None else layer_indicator(rec, lay, name)
    if name == "device_mfu":
        peak = CATALOG.peak_flops(rec.hw, rec.dtype)
        return _ratio(
            sum(x.flops or 0.0 for x in rec.layers), None if peak is None else rec.window_s * peak
        )
    if name == "error_rate":
        if rec.slo is None or rec.ingress is None:
            return None
        failed, rate = rec.slo.errors, rec.ingress.req_rate
        if failed is None or rate is None:
            return None
        return _ratio(failed, max(rate * rec.window_s, failed))
    for part in (rec.ingress, rec.device_stats, rec.slo):
        if part is not None and hasattr(part, name):
            val = getattr(part, name)
            return None if val is None else float(val)
    raise KeyError(name)


def series(
    dec: Decoded,
    name: str,
    layer: str | None,
    devices: set[str] | None = None,
    pool: str | None = None,
) -> tuple[F64, F64]:
    """(window ts, median over the selected devices) of an indicator, one point per window;
    the mean for request shares (quality), as the labels take it."""
    ts_out: list[float] = []
    vals: list[float] = []
    for ts in dec.ts:
        got = [
            v
            for r in dec.records[ts]
            if (devices is None or r.device in devices)
            and (pool is None or r.pool == pool)
            and (v := indicator(r, name, layer)) is not None
        ]
        if got:
            ts_out.append(ts)
            vals.append(float(np.mean(got) if name in MEAN_OF else np.median(got)))
    return np.asarray(ts_out, dtype=np.float64), np.asarray(vals, dtype=np.float64)


def span_mean(ts: F64, vals: F64, span: tuple[float, float] | list[float]) -> float:
    """Mean of the per-window values whose ts lies in the (from, to] span."""
    sel = (ts > span[0]) & (ts <= span[1])
    if not sel.any():
        raise ValueError(f"no windows in span {span}")
    return float(vals[sel].mean())
