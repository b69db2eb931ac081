"""The stream table: registry of devices and (device, layer) streams, and batch -> frames.

It turns decoded window records into two dense matrices (layer streams and
device streams, NaN = not measured), drops exact duplicates and late records
with a reason, notes kernel-variant changes, and expires silent streams so
memory stays flat as devices come and go. Row ids are reused after expiry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np

from monitor.arrays import F64, I64
from monitor.hardware import Catalog
from monitor.indicators import (
    DEVICE_METRICS,
    LAYER_INPUTS,
    LAYER_METRICS,
    device_mfu,
    group_means,
    group_sums,
    layer_metrics,
)
from monitor.wire import Layer, WindowRecord

astuple = msgspec.structs.astuple
# Layer's numeric counters are its fields 1..10, in LAYER_INPUTS order.
_N_INPUTS = 1 + len(LAYER_INPUTS)
if Layer.__struct_fields__[1:_N_INPUTS] != LAYER_INPUTS:  # pragma: no cover - import-time guard
    raise ImportError("Layer field order no longer matches LAYER_INPUTS")


@dataclass(frozen=True, slots=True)
class Frame:
    """One batch as matrices: rows sorted by event time; a row may repeat (several windows)."""

    layer_rows: I64
    layer_ts: F64
    layer_values: F64  # (n, len(LAYER_METRICS))
    device_rows: I64
    device_ts: F64
    device_values: F64  # (m, len(DEVICE_METRICS))
    kernel_changes: list[tuple[int, float, str | None, str]]  # (layer row, ts, old, new)
    # Fleet-partition views: group ids of (pool, model, layer) per layer row and of
    # (pool, model) per device row, and each row's load (batch, req_rate; NaN = unknown).
    layer_group: I64 = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    device_group: I64 = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    layer_load: F64 = field(default_factory=lambda: np.empty((0, 2)))
    device_load: F64 = field(default_factory=lambda: np.empty((0, 2)))
    # Per (group, window) aggregates: pool MFU = sum(flops/peak) / sum(busy_s), etc.
    pool_layer_rows: I64 = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    pool_layer_ts: F64 = field(default_factory=lambda: np.empty(0))
    pool_layer_values: F64 = field(default_factory=lambda: np.empty((0, len(LAYER_METRICS))))
    pool_device_rows: I64 = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    pool_device_ts: F64 = field(default_factory=lambda: np.empty(0))
    pool_device_values: F64 = field(default_factory=lambda: np.empty((0, len(DEVICE_METRICS))))
    pool_layer_load: F64 = field(default_factory=lambda: np.empty((0, 2)))
    pool_device_load: F64 = field(default_factory=lambda: np.empty((0, 2)))

    @staticmethod
    def waves(rows: I64) -> list[I64]:
        """Split row positions into waves in which every row occurs at most once, in order."""
        if rows.size == 0:
            return []
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        starts = np.r_[True, sorted_rows[1:] != sorted_rows[:-1]]
        group_start = np.maximum.accumulate(np.where(starts, np.arange(rows.size), 0))
        rank = np.empty(rows.size, dtype=np.int64)
        rank[order] = np.arange(rows.size) - group_start
        return [np.flatnonzero(rank == k) for k in range(int(rank.max()) + 1)]


# (rows, event times, values, family group per row, load per row) of one stream kind.
KindView = tuple[I64, F64, F64, I64, F64]


@dataclass(frozen=True, slots=True)
class StreamKind:
    """One kind of stream the detectors watch: its metric columns and its part of a Frame."""

    name: str
    columns: tuple[str, ...]
    aggregate: bool  # a (pool, model[, layer]) aggregate rather than one device's stream
    view: Callable[[Frame], KindView]


# Device streams (per layer type and per device), and per (pool, model[, layer]) aggregates
# of a partition's devices: a pool-wide shift too small for any one device's detector is
# one clear signal there. An aggregate is its family's only stream: its rows are its groups.
STREAM_KINDS: tuple[StreamKind, ...] = (
    StreamKind("layer", LAYER_METRICS, False, lambda f: (
        f.layer_rows, f.layer_ts, f.layer_values, f.layer_group, f.layer_load)),
    StreamKind("device", DEVICE_METRICS, False, lambda f: (
        f.device_rows, f.device_ts, f.device_values, f.device_group, f.device_load)),
    StreamKind("pool_layer", LAYER_METRICS, True, lambda f: (
        f.pool_layer_rows, f.pool_layer_ts, f.pool_layer_values, f.pool_layer_rows,
        f.pool_layer_load)),
    StreamKind("pool_device", DEVICE_METRICS, True, lambda f: (
        f.pool_device_rows, f.pool_device_ts, f.pool_device_values, f.pool_device_rows,
        f.pool_device_load)),
)  # fmt: skip


@dataclass(slots=True)
class Rejection:
    """A record that was not used, and why."""

    index: int
    reason: str
    kind: str  # duplicate | late


@dataclass(slots=True)
class _Columns:
    """One batch's raw columns before they become matrices (`StreamTable._collect`)."""

    lrows: list[int] = field(default_factory=list)
    lts: list[float] = field(default_factory=list)
    lraw: list[tuple[float | None, ...]] = field(default_factory=list)
    lpeak: list[float] = field(default_factory=list)
    kchanges: list[tuple[int, float, str | None, str]] = field(default_factory=list)
    drows: list[int] = field(default_factory=list)
    dts: list[float] = field(default_factory=list)
    dwin: list[float] = field(default_factory=list)
    dpeak: list[float] = field(default_factory=list)
    dflops: list[float] = field(default_factory=list)
    draw: list[tuple[float | None, ...]] = field(default_factory=list)
    lgroup: list[int] = field(default_factory=list)
    dgroup: list[int] = field(default_factory=list)
    dload: list[tuple[float | None, float | None]] = field(default_factory=list)
    lload_idx: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Device:
    row: int
    host: str | None
    pool: str | None
    model: str | None
    hw: str | None
    dtype: str | None
    peak: float
    last_ts: float = -np.inf
    window_s: float = 10.0


@dataclass
class StreamTable:
    """Registry of streams and their metadata; builds Frames from decoded records."""

    catalog: Catalog
    ttl_s: float = 3600.0
    devices: dict[str, _Device] = field(default_factory=dict)
    device_names: list[str | None] = field(default_factory=list)
    layer_index: dict[tuple[int, str], int] = field(default_factory=dict)
    layer_keys: list[tuple[int, str] | None] = field(default_factory=list)
    last_kernel: list[str | None] = field(default_factory=list)
    free_device_rows: list[int] = field(default_factory=list)
    free_layer_rows: list[int] = field(default_factory=list)
    unknown_hw: Counter[str] = field(default_factory=Counter)
    groups: dict[tuple[str | None, str | None, str], int] = field(default_factory=dict)
    group_keys: list[tuple[str | None, str | None, str]] = field(default_factory=list)
    newly_unknown: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    # -- registry ----------------------------------------------------------------
    def _device(self, rec: WindowRecord) -> _Device:
        dev = self.devices.get(rec.device)
        if dev is None:
            row = self.free_device_rows.pop() if self.free_device_rows else len(self.device_names)
            if row == len(self.device_names):
                self.device_names.append(rec.device)
            else:
                self.device_names[row] = rec.device
            dev = _Device(row, rec.host, rec.pool, rec.model, None, None, np.nan)
            self.devices[rec.device] = dev
        if dev.hw != rec.hw or dev.dtype != rec.dtype:
            peak = self.catalog.peak_flops(rec.hw, rec.dtype)
            dev.hw, dev.dtype = rec.hw, rec.dtype
            dev.peak = np.nan if peak is None else peak
            if peak is None and rec.device not in self.unknown_hw:
                self.newly_unknown.append((rec.device, rec.hw, rec.dtype))
        if np.isnan(dev.peak):
            self.unknown_hw[rec.device] += 1
        dev.host, dev.pool, dev.model = rec.host, rec.pool, rec.model
        dev.window_s = rec.window_s
        return dev

    def _layer_row(self, dev_row: int, layer: str) -> int:
        key = (dev_row, layer)
        row = self.layer_index.get(key)
        if row is None:
            row = self.free_layer_rows.pop() if self.free_layer_rows else len(self.layer_keys)
            if row == len(self.layer_keys):
                self.layer_keys.append(key)
                self.last_kernel.append(None)
            else:
                self.layer_keys[row] = key
                self.last_kernel[row] = None
            self.layer_index[key] = row
        return row

    def group(self, pool: str | None, model: str | None, layer: str) -> int:
        """Id of the (pool, model, layer) group; layer "" is the device-level group."""
        key = (pool, model, layer)
        gid = self.groups.get(key)
        if gid is None:
            gid = self.groups[key] = len(self.group_keys)
            self.group_keys.append(key)
        return gid

    def device_of_layer_row(self, row: int) -> tuple[str, str]:
        """(device id, layer type) of a layer stream row."""
        key = self.layer_keys[row]
        if key is None:
            raise KeyError(row)
        name = self.device_names[key[0]]
        assert name is not None  # noqa: S101 - rows in use always have a name
        return name, key[1]

    # -- batch -> frame ------------------------------------------------------------
    def build(self, records: list[WindowRecord]) -> tuple[Frame, list[Rejection]]:
        """Register streams, drop duplicates/late records, and derive the metric matrices."""
        accepted, rejections = self._accept(records)
        return self._frame(self._collect(accepted)), rejections

    def _accept(
        self, records: list[WindowRecord]
    ) -> tuple[list[tuple[WindowRecord, _Device]], list[Rejection]]:
        """Records in event-time order, less duplicates and windows not newer than their
        stream's last; the devices' last window times advance."""
        rejections: list[Rejection] = []
        order = sorted(range(len(records)), key=lambda i: records[i].ts)
        seen: dict[tuple[str, float], int] = {}
        accepted: list[tuple[WindowRecord, _Device]] = []
        for i in order:
            rec = records[i]
            prev = seen.get((rec.device, rec.ts))
            if prev is not None:
                rejections.append(
                    Rejection(
                        i,
                        f"duplicate: device {rec.device} window ts={rec.ts} already in this batch",
                        "duplicate",
                    )
                )
                continue
            dev = self.devices.get(rec.device)
            if dev is not None and rec.ts <= dev.last_ts:
                kind = "duplicate" if rec.ts == dev.last_ts else "late"
                rejections.append(Rejection(
                    i, f"{kind}: device {rec.device} window ts={rec.ts} is not newer than the "
                    f"stream's last window ts={dev.last_ts}", kind))  # fmt: skip
                continue
            seen[(rec.device, rec.ts)] = i
            dev = self._device(rec)
            accepted.append((rec, dev))
        for rec, dev in accepted:
            dev.last_ts = max(dev.last_ts, rec.ts)
        return accepted, rejections

    def _collect(self, accepted: list[tuple[WindowRecord, _Device]]) -> _Columns:
        """The batch's raw columns, one Python pass over records and layers."""
        c = _Columns()
        # Local names: this loop runs once per record and layer, attribute lookups add up.
        lrows, lts, lraw, lpeak, kchanges = c.lrows, c.lts, c.lraw, c.lpeak, c.kchanges
        drows, dts, dwin, dpeak, dflops, draw = c.drows, c.dts, c.dwin, c.dpeak, c.dflops, c.draw
        lgroup, dgroup, dload, lload_idx = c.lgroup, c.dgroup, c.dload, c.lload_idx
        index, last_kernel, groups = self.layer_index, self.last_kernel, self.groups
        for rec, dev in accepted:
            flops_sum = 0.0
            any_flops = False
            for layer in rec.layers:
                row = index.get((dev.row, layer.type))
                if row is None:
                    row = self._layer_row(dev.row, layer.type)
                lrows.append(row)
                lraw.append(astuple(layer)[1:_N_INPUTS])
                gkey = (dev.pool, dev.model, layer.type)
                gid = groups.get(gkey)
                lgroup.append(gid if gid is not None else self.group(*gkey))
                if layer.flops is not None and layer.type != "all":
                    flops_sum += layer.flops
                    any_flops = True
                kernel = layer.kernel
                if kernel is not None:
                    old = last_kernel[row]
                    if old != kernel:
                        if old is not None:
                            kchanges.append((row, rec.ts, old, kernel))
                        last_kernel[row] = kernel
            n = len(rec.layers)
            lts.extend([rec.ts] * n)
            lpeak.extend([dev.peak] * n)
            lload_idx.extend([len(drows)] * n)
            if not any_flops:
                # An exporter that knows only device counters sends one layer "all".
                alls = [la.flops for la in rec.layers if la.type == "all" and la.flops is not None]
                flops_sum, any_flops = (alls[0], True) if alls else (0.0, False)
            ing, st, slo = rec.ingress, rec.device_stats, rec.slo
            dgroup.append(self.group(dev.pool, dev.model, ""))
            dload.append((ing.batch, ing.req_rate) if ing else (None, None))
            drows.append(dev.row)
            dts.append(rec.ts)
            dwin.append(rec.window_s)
            dpeak.append(dev.peak)
            dflops.append(flops_sum if any_flops else np.nan)
            draw.append((
                st.clock_mhz if st else None, st.temp_c if st else None,
                st.power_w if st else None,
                ing.req_rate if ing else None, ing.queue_depth if ing else None,
                ing.queue_wait_ms if ing else None, ing.batch if ing else None,
                slo.lat_p50_ms if slo else None, slo.lat_p95_ms if slo else None,
                slo.lat_p99_ms if slo else None, slo.quality if slo else None,
            ))  # fmt: skip

        return c

    def _frame(self, c: _Columns) -> Frame:
        """Metric matrices and pool aggregates from the raw columns (vectorised)."""
        raw = np.array(c.lraw, dtype=np.float64).reshape(-1, len(LAYER_INPUTS))
        peak = np.array(c.lpeak, dtype=np.float64)
        lvals = layer_metrics(raw, peak)
        dvals = np.empty((len(c.drows), len(DEVICE_METRICS)))
        dvals[:, 0] = device_mfu(
            np.array(c.dflops, dtype=np.float64),
            np.array(c.dwin),
            np.array(c.dpeak, dtype=np.float64),
        )
        dvals[:, 1:] = np.array(c.draw, dtype=np.float64).reshape(-1, len(DEVICE_METRICS) - 1)
        layer_ts = np.array(c.lts, dtype=np.float64)
        device_ts = np.array(c.dts, dtype=np.float64)
        layer_group = np.array(c.lgroup, dtype=np.int64)
        device_group = np.array(c.dgroup, dtype=np.int64)
        device_load = np.array(c.dload, dtype=np.float64).reshape(-1, 2)
        layer_load = device_load[np.array(c.lload_idx, dtype=np.int64)]
        pl_rows, pl_ts, pl_raw, pl_peak = group_sums(layer_group, layer_ts, raw, peak)
        pd_rows, pd_ts, pd_vals = group_means(device_group, device_ts, dvals)
        _, _, pl_load = group_means(layer_group, layer_ts, layer_load)
        _, _, pd_load = group_means(device_group, device_ts, device_load)
        return Frame(
            layer_rows=np.array(c.lrows, dtype=np.int64),
            layer_ts=layer_ts,
            layer_values=lvals,
            device_rows=np.array(c.drows, dtype=np.int64),
            device_ts=device_ts,
            device_values=dvals,
            kernel_changes=c.kchanges,
            layer_group=layer_group,
            device_group=device_group,
            layer_load=layer_load,
            device_load=device_load,
            pool_layer_rows=pl_rows,
            pool_layer_ts=pl_ts,
            pool_layer_values=layer_metrics(pl_raw, pl_peak),
            pool_device_rows=pd_rows,
            pool_device_ts=pd_ts,
            pool_device_values=pd_vals,
            pool_layer_load=pl_load,
            pool_device_load=pd_load,
        )

    # -- expiry ------------------------------------------------------------------------
    def expire(self, now_ts: float) -> tuple[I64, I64]:
        """Drop devices silent for longer than ttl; return (device rows, layer rows) freed."""
        gone = [name for name, d in self.devices.items() if now_ts - d.last_ts > self.ttl_s]
        dev_rows: list[int] = []
        layer_rows: list[int] = []
        for name in gone:
            dev = self.devices.pop(name)
            dev_rows.append(dev.row)
            self.device_names[dev.row] = None
            self.unknown_hw.pop(name, None)
        gone_rows = set(dev_rows)
        for key, row in list(self.layer_index.items()):
            if key[0] in gone_rows:
                del self.layer_index[key]
                self.layer_keys[row] = None
                self.last_kernel[row] = None
                layer_rows.append(row)
        self.free_device_rows.extend(dev_rows)
        self.free_layer_rows.extend(layer_rows)
        return np.array(dev_rows, dtype=np.int64), np.array(layer_rows, dtype=np.int64)

    # -- checkpoint ----------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """Registry state as bytes (restored by `restore`); dict orders are kept."""
        return _table_encoder.encode(
            _TableState(
                self.ttl_s,
                [_device_row(name, d) for name, d in self.devices.items()],
                self.device_names,
                [(row, layer, r) for (row, layer), r in self.layer_index.items()],
                self.layer_keys,
                self.last_kernel,
                self.free_device_rows,
                self.free_layer_rows,
                list(self.unknown_hw.items()),
                self.group_keys,
            )
        )

    @classmethod
    def restore(cls, blob: bytes, catalog: Catalog, ttl_s: float | None = None) -> StreamTable:
        """Rebuild a table from `snapshot` bytes; `ttl_s` replaces the checkpoint's (the
        configured one wins after a restart)."""
        s = msgspec.msgpack.decode(blob, type=_TableState)
        return cls(
            catalog=catalog,
            ttl_s=s.ttl_s if ttl_s is None else float(ttl_s),
            devices={d[0]: _Device(*d[1:]) for d in s.devices},
            device_names=s.device_names,
            layer_index={(row, layer): r for row, layer, r in s.layer_index},
            layer_keys=[None if k is None else (k[0], k[1]) for k in s.layer_keys],
            last_kernel=s.last_kernel,
            free_device_rows=s.free_device_rows,
            free_layer_rows=s.free_layer_rows,
            unknown_hw=Counter(dict(s.unknown_hw)),
            groups={(p, m, la): i for i, (p, m, la) in enumerate(s.group_keys)},
            group_keys=[(p, m, la) for p, m, la in s.group_keys],
        )


_DeviceRow = tuple[
    str, int, str | None, str | None, str | None, str | None, str | None, float, float, float
]


def _device_row(name: str, d: _Device) -> _DeviceRow:
    return (name, d.row, d.host, d.pool, d.model, d.hw, d.dtype, d.peak, d.last_ts, d.window_s)


class _TableState(msgspec.Struct, array_like=True):
    ttl_s: float
    devices: list[_DeviceRow]
    device_names: list[str | None]
    layer_index: list[tuple[int, str, int]]
    layer_keys: list[tuple[int, str] | None]
    last_kernel: list[str | None]
    free_device_rows: list[int]
    free_layer_rows: list[int]
    unknown_hw: list[tuple[str, int]]
    group_keys: list[tuple[str | None, str | None, str]]


_table_encoder = msgspec.msgpack.Encoder()
