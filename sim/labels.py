"""Ground-truth labels: each incident's scope, stage, change and how far its indicators move.

`before` / `after` are medians over the incident's devices, averaged over a
baseline span that ends at the onset and an effect span after the effect has
settled. They come from a side run of the scope's hosts (at most 8 of them)
that reproduces exactly the noise those devices get in the full run (every
random draw is made fleet-wide and then cut), so they are what the records
show, straggler waits and all, not a noise-free expectation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.arrays import F64, I64
from sim.fleet import Fleet
from sim.physics import Frame, Physics

if TYPE_CHECKING:
    from sim.scenarios import Incident, Plan

STAGE_OF: dict[str, str] = {
    "req_rate": "ingress",
    "queue_depth": "ingress",
    "queue_wait_ms": "ingress",
    "batch": "ingress",
    "fallback_frac": "lowering",
    "kernel": "lowering",
    "sram_hit": "scheduling",
    "spill_bytes": "scheduling",
    "intensity": "scheduling",
    "mfu": "execution",
    "stall_frac": "execution",
    "occupancy": "execution",
    "sync_frac": "execution",
    "device_mfu": "execution",
    "power_w": "execution",
    "temp_c": "execution",
    "clock_mhz": "execution",
    "lat_p50_ms": "validation",
    "lat_p95_ms": "validation",
    "lat_p99_ms": "validation",
    "quality": "validation",
    "errors": "validation",
    "error_rate": "validation",
}
SPAN_WINDOWS = 6
# Indicators read as a share of requests: the scope's value is the mean over its devices
# (a median of per-device failure shares near 0 is 0, however many requests fail).
MEAN_OF = {"quality": np.mean, "errors": np.mean, "error_rate": np.mean}
MAX_LABEL_HOSTS = 8


def frame_indicator(frame: Frame, fleet: Fleet, name: str, layer: str | None, w: float) -> F64:
    """Per-device value of indicator `name` (for `layer`) in a frame."""
    if layer is None:
        return _device_indicator(frame, fleet, name, w)
    peak = fleet.dev["peak"]
    c = fleet.layer_col(layer)
    with np.errstate(divide="ignore", invalid="ignore"):
        match name:
            case "mfu":
                return frame.flops[:, c] / (frame.busy_s[:, c] * peak)
            case "stall_frac":
                return frame.stall[:, c] / frame.cycles[:, c]
            case "occupancy":
                return frame.occupancy[:, c]
            case "sram_hit":
                return frame.sram_hit[:, c]
            case "fallback_frac":
                return frame.fallback[:, c]
            case "spill_bytes":
                return frame.spill[:, c]
            case "intensity":
                return frame.flops[:, c] / frame.bytes_hbm[:, c]
            case "sync_frac":
                return frame.sync[:, c] / frame.busy_s[:, c]
    raise KeyError(name)


def _device_indicator(frame: Frame, fleet: Fleet, name: str, w: float) -> F64:
    """Per-device value of a device-level indicator in a frame."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if name == "device_mfu":
            out: F64 = frame.flops.sum(axis=1) / (w * fleet.dev["peak"])
            return out
        if name == "error_rate":  # failed requests per request of the window
            failed: F64 = frame.errors / np.maximum(frame.req_rate * w, frame.errors)
            return failed
    attr = {"lat_p50_ms": "p50", "lat_p95_ms": "p95", "lat_p99_ms": "p99"}.get(name, name)
    val: F64 = getattr(frame, attr)
    return val


def _label_subset(fleet: Fleet, devices: I64) -> I64:
    hosts = np.unique(fleet.host_idx[devices])
    if len(hosts) > MAX_LABEL_HOSTS:
        hosts = hosts[np.linspace(0, len(hosts) - 1, MAX_LABEL_HOSTS).round().astype(np.int64)]
    return np.flatnonzero(np.isin(fleet.host_idx, hosts)).astype(np.int64)


def spans(
    inc: Incident, plan: Plan, w: float, start: float, end: float
) -> tuple[float, tuple[float, float], tuple[float, float]]:
    """(onset_ts, baseline span, effect span) of an incident; spans are (from, to] in event time."""
    onset = inc.fault.onset_ts
    stop = end if inc.fault.end_ts is None else min(end, inc.fault.end_ts)
    if inc.condition == "burst":
        pool = plan.fleet.pools[plan.fleet.pool_id(inc.pool)]
        before = [b for b in pool.traffic.bursts if b.end <= onset]
        after = [b for b in pool.traffic.bursts if b.start >= onset]
        if not before or not after:
            raise ValueError(f"incident {inc.id}: needs a burst before and after the change")
        b0, b1 = before[-1], after[0]
        return b1.start, (b0.start + w, b0.end), (b1.start + w, min(b1.end, stop))
    settle = onset + inc.settle_windows * w
    return (
        onset,
        (max(onset - SPAN_WINDOWS * w, start), onset),
        (settle, min(settle + SPAN_WINDOWS * w, stop)),
    )


def incident_label(
    inc: Incident, plan: Plan, *, seed: int, window_s: float, start_ts: float, end_ts: float
) -> dict[str, Any]:
    """The label dict of one incident (noise-free before/after on its scope)."""
    fleet = plan.fleet
    w = window_s
    onset, base, eff = spans(inc, plan, w, start_ts, end_ts)
    subset = _label_subset(fleet, inc.fault.devices)
    phys = Physics(
        fleet,
        list(plan.faults),
        plan.noise,
        seed=seed,
        window_s=w,
        start_ts=start_ts,
        subset=subset,
        join_ts=plan.join_ts,
    )
    rows = np.flatnonzero(np.isin(subset, inc.fault.devices))
    wanted = [*inc.indicators, *inc.unchanged]
    sums = {key: [0.0, 0.0] for key in wanted}
    counts = [0, 0]
    k_last = round((eff[1] - start_ts) / w) - 1
    for k in range(k_last + 1):
        frame = phys.step(k)
        which = 0 if base[0] < frame.ts <= base[1] else 1 if eff[0] < frame.ts <= eff[1] else -1
        if which < 0:
            continue
        counts[which] += 1
        for key in wanted:
            vals = frame_indicator(frame, phys.f, key[0], key[1], w)[rows[frame.emit[rows]]]
            if len(vals):
                sums[key][which] += float(MEAN_OF.get(key[0], np.median)(vals))

    def entry(key: tuple[str, str | None]) -> dict[str, Any]:
        before = sums[key][0] / max(counts[0], 1)
        after = sums[key][1] / max(counts[1], 1)
        delta = 100.0 * (after - before) / before if before else None
        return {
            "name": key[0],
            "layer": key[1],
            "stage": STAGE_OF[key[0]],
            "before": _r(before),
            "after": _r(after),
            "delta_pct": None if delta is None else round(delta, 2),
        }

    devices = inc.fault.devices
    pool = fleet.pools[fleet.pool_id(inc.pool)]
    hosts = sorted({fleet.host_names[h] for h in fleet.host_idx[devices].tolist()})
    return {
        "id": inc.id,
        "onset_ts": onset,
        "onset_window_ts": onset + w,
        "end_ts": inc.fault.end_ts,
        "scope": {
            "level": inc.level,
            "pool": inc.pool,
            "model": pool.model,
            "hosts": hosts,
            "devices": [fleet.device_names[i] for i in devices.tolist()],
            "device_count": len(devices),
        },
        "layers": list(inc.layers),
        "indicators": [entry(k) for k in inc.indicators],
        "unchanged": [entry(k) for k in inc.unchanged],
        "first_failing_stage": inc.stage,
        "bottleneck": inc.bottleneck,
        "change_id": inc.change_id,
        "condition": inc.condition,
        "context": inc.context,
        "kernels": inc.kernels,
        "baseline": list(base),
        "effect": list(eff),
        "description": inc.description,
    }


def _r(x: float) -> float:
    """Round to 6 significant digits so labels read cleanly."""
    if x == 0 or not np.isfinite(x):
        return float(x)
    return float(f"{x:.6g}")
