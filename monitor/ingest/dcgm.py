"""DCGM (dcgm-exporter text, dcgmi dmon CSV) -> window records with one `all` layer.

DCGM sees devices, not layers: each device (or MIG instance) gets one `all` layer.
busy_s = GR_ENGINE_ACTIVE × window; occupancy = SM_OCCUPANCY; bytes_hbm = DRAM_ACTIVE ×
bandwidth × window; flops = PIPE_TENSOR_ACTIVE × peak × (SM clock / boost clock) ×
window, always `flops_estimated` (NVIDIA documents no conversion from pipe activity to
FLOPs). Power comes from the energy counter's difference when two scrapes exist.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from monitor.errors import IngestError
from monitor.hardware import Catalog, HardwareSpec
from monitor.ingest.rules import HwAliases

SOURCE = "dcgm-exporter"
GR, SM_OCC, DRAM, TENSOR = "gr", "occupancy", "dram", "tensor"
POWER, TEMP, CLOCK, ENERGY = "power_w", "temp_c", "clock_mhz", "energy_mj"
FIELDS = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": GR,
    "DCGM_FI_PROF_SM_OCCUPANCY": SM_OCC,
    "DCGM_FI_PROF_DRAM_ACTIVE": DRAM,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": TENSOR,
    "DCGM_FI_DEV_POWER_USAGE": POWER,
    "DCGM_FI_DEV_GPU_TEMP": TEMP,
    "DCGM_FI_DEV_SM_CLOCK": CLOCK,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ENERGY,
}
# `dcgmi dmon` column names for the same fields.
DMON_FIELDS = {"GRACT": GR, "SMOCC": SM_OCC, "DRAMA": DRAM, "TENSO": TENSOR,
               "POWER": POWER, "TMPTR": TEMP, "GTEMP": TEMP, "SMCLK": CLOCK}  # fmt: skip
_RATIOS = (GR, SM_OCC, DRAM, TENSOR)
_MIG_SLICES = re.compile(r"^(\d+)g\.")
_MIG_FULL = 7.0  # compute slices of a whole A100/H100


@dataclass(slots=True)
class Device:
    """One device's (or MIG instance's) readings from one scrape."""

    device: str
    host: str
    model_name: str | None = None
    mig_profile: str | None = None
    pool: str | None = None
    values: dict[str, float] = field(default_factory=dict)


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    """A label by any of its spellings (`Hostname`/`hostname`, Prometheus' `exported_*`)."""
    for name in names:
        for key in (name, f"exported_{name}"):
            if labels.get(key):
                return labels[key]
    return None


def parse_exposition(
    text: str, host: str | None = None, pool_label: str | None = None
) -> dict[str, Device]:
    """Devices in one scrape of dcgm-exporter text, keyed by device id.

    Series without a `gpu` label name no device and are skipped.
    """
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as exc:
        raise IngestError(f"not Prometheus exposition text: {exc}") from None
    devices: dict[str, Device] = {}
    for fam in families:
        key = FIELDS.get(fam.name)
        if key is None:
            continue
        for s in fam.samples:
            gpu = _label(s.labels, "gpu")
            if gpu is None or not math.isfinite(s.value):
                continue
            h = host or _label(s.labels, "Hostname", "hostname") or "localhost"
            mig = _label(s.labels, "GPU_I_ID")
            dev_id = f"{h}/gpu{gpu}" + (f"/mig{mig}" if mig else "")
            dev = devices.get(dev_id)
            if dev is None:
                dev = devices[dev_id] = Device(
                    dev_id, h, _label(s.labels, "modelName"), _label(s.labels, "GPU_I_PROFILE"),
                    _label(s.labels, pool_label) if pool_label else None,
                )  # fmt: skip
            dev.values[key] = float(s.value)
    if not families:
        raise IngestError("not Prometheus exposition text: no metric families")
    return devices


def _ratio(v: float | None) -> float | None:
    """DCGM ratios are 0..1; some exporters print percent."""
    if v is None or not math.isfinite(v) or v < 0:
        return None
    return v / 100.0 if v > 1.0 else v


def _share(dev: Device) -> float:
    """A MIG instance's share of the whole GPU's peaks (`3g.40gb` -> 3/7)."""
    m = _MIG_SLICES.match(dev.mig_profile or "")
    return min(int(m.group(1)) / _MIG_FULL, 1.0) if m else 1.0


@dataclass(frozen=True, slots=True)
class Naming:
    """What DCGM cannot tell: the workload, the pool, a hardware override."""

    aliases: HwAliases
    catalog: Catalog
    dtype: str = "bf16"
    pool: str | None = None
    pools: Mapping[str, str] = field(default_factory=dict)
    model: str | None = None
    hw: str | None = None


def record(
    dev: Device,
    ts: float,
    window_s: float,
    naming: Naming,
    prev: Device | None = None,
    prev_ts: float | None = None,
) -> dict[str, Any]:
    """One window record for one device (contract §1)."""
    v = dev.values
    hw = naming.hw or naming.aliases.resolve(dev.model_name)
    spec = naming.catalog.get(hw)
    layer: dict[str, Any] = {"type": "all"}
    gr, occ, dram, tensor = (_ratio(v.get(k)) for k in _RATIOS)
    if gr is not None:
        layer["busy_s"] = gr * window_s
    if occ is not None:
        layer["occupancy"] = occ
    estimated = False
    if spec is not None:
        share = _share(dev)
        if dram is not None:
            layer["bytes_hbm"] = dram * spec.hbm_bytes_per_s * share * window_s
        flops = _flops(tensor, v.get(CLOCK), spec, naming.dtype, share, window_s)
        if flops is not None:
            layer["flops"], estimated = flops, True
    rec: dict[str, Any] = {
        "v": 1,
        "ts": ts,
        "window_s": window_s,
        "device": dev.device,
        "host": dev.host,
    }
    pool = naming.pool or dev.pool or naming.pools.get(dev.host)
    extras = {
        "pool": pool,
        "model": naming.model,
        "hw": hw,
        "dtype": naming.dtype if estimated else None,
    }
    rec.update({k: x for k, x in extras.items() if x})
    rec["source"] = SOURCE
    if estimated:
        rec["flops_estimated"] = True
    stats = _device_stats(dev, prev, ts, prev_ts)
    if stats:
        rec["device_stats"] = stats
    rec["layers"] = [layer] if len(layer) > 1 else []
    return rec


def _flops(
    tensor: float | None,
    clock: float | None,
    spec: HardwareSpec,
    dtype: str,
    share: float,
    window_s: float,
) -> float | None:
    peak = spec.peak(dtype)
    if tensor is None or peak is None:
        return None
    # Peaks assume the boost clock: a throttled SM does proportionally less per active cycle.
    ratio = 1.0
    if clock is not None and spec.max_clock_mhz and clock > 0:
        ratio = min(clock / spec.max_clock_mhz, 1.0)
    return tensor * peak * ratio * share * window_s


def _device_stats(
    dev: Device, prev: Device | None, ts: float, prev_ts: float | None
) -> dict[str, float]:
    v = dev.values
    stats: dict[str, float] = {}
    power = v.get(POWER)
    e1, e0 = v.get(ENERGY), prev.values.get(ENERGY) if prev else None
    if e1 is not None and e0 is not None and prev_ts is not None and ts > prev_ts and e1 >= e0:
        power = (e1 - e0) / 1000.0 / (ts - prev_ts)  # mJ counter -> mean W over the window
    if power is not None and power >= 0:
        stats["power_w"] = power
    if v.get(TEMP) is not None:
        stats["temp_c"] = v[TEMP]
    if v.get(CLOCK) is not None and v[CLOCK] >= 0:
        stats["clock_mhz"] = v[CLOCK]
    return stats


def read_dmon(path: Path, host: str, interval_s: float) -> list[tuple[float, float, Device]]:
    """(ts, window_s, device) per entity per `interval_s` of a 1 Hz CSV
    (`EntityId,GRACT,...,TimeStamp`, as MIGProfiler records them); column means per window."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as exc:
        raise IngestError(f"{path}: {exc}") from None
    if not rows or "EntityId" not in rows[0] or "TimeStamp" not in rows[0]:
        raise IngestError(f"{path}: not a dmon CSV (no EntityId and TimeStamp columns)")
    head = rows[0]
    cols = {i: DMON_FIELDS[h] for i, h in enumerate(head) if h in DMON_FIELDS}
    try:
        data = np.array([[_num(x) for x in r] for r in rows[1:] if len(r) == len(head)])
    except ValueError as exc:
        raise IngestError(f"{path}: not a dmon CSV ({exc})") from None
    if data.size == 0:
        raise IngestError(f"{path}: no samples")
    data = data[np.isfinite(data[:, head.index("TimeStamp")])]
    ent, t = data[:, head.index("EntityId")].astype(np.int64), data[:, head.index("TimeStamp")]
    period = float(np.median(np.diff(np.unique(t)))) if np.unique(t).size > 1 else 1.0
    win = np.floor((t - t.min()) / interval_s).astype(np.int64)
    key = ent * (int(win.max()) + 1) + win
    groups, inv = np.unique(key, return_inverse=True)
    count = np.bincount(inv)
    t_end = np.zeros(groups.size)
    np.maximum.at(t_end, inv, t)
    out = []
    means = {}
    for i, name in cols.items():
        ok = np.isfinite(data[:, i])
        n = np.bincount(inv, weights=ok, minlength=groups.size)
        total = np.bincount(inv, weights=np.where(ok, data[:, i], 0.0), minlength=groups.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            means[name] = np.where(n > 0, total / n, np.nan)
    for g in range(groups.size):
        e = int(groups[g] // (int(win.max()) + 1))
        values = {n: float(m[g]) for n, m in means.items() if np.isfinite(m[g])}
        dev = Device(f"{host}/gpu{e}", host, values=values)
        out.append((float(t_end[g]), float(count[g]) * period, dev))
    return sorted(out, key=lambda x: (x[0], x[2].device))


def _num(text: str) -> float:
    """A dmon cell: a number, or NaN where dmon printed N/A (field not available)."""
    return math.nan if text.strip().upper() in ("N/A", "") else float(text)


def records_from(
    devices: Iterable[Device], ts: float, window_s: float, naming: Naming
) -> list[dict[str, Any]]:
    """One record per device for one scrape."""
    return [record(d, ts, window_s, naming) for d in sorted(devices, key=lambda d: d.device)]
