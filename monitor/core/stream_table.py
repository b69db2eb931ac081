"""The stream table: registry of devices and (device, layer) streams, and batch -> frames.

It turns decoded window records into two dense matrices (layer streams and
device streams, NaN = not measured), drops exact duplicates and late records
with a reason, notes kernel-variant changes, and expires silent streams and
groups so memory stays flat as devices and pools come and go. Caps on devices,
layer streams and groups (per table, i.e. per input partition) bound it outright:
at a cap the least recently seen ones are evicted to make room. Row ids are
reused after expiry and eviction.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import attrgetter, is_not
from typing import Protocol

import msgspec
import numpy as np

from monitor.arrays import F64, I64, Bools, grown
from monitor.core.coverage import COARSE_LAYER, record_masks
from monitor.core.layer_index import LayerIndex
from monitor.core.window_sums import OpenWindows
from monitor.hardware import Catalog
from monitor.indicators import (
    DEVICE_METRICS,
    LAYER_INPUTS,
    LAYER_METRICS,
    device_mfu,
    error_rate,
    layer_metrics,
    per_peak,
    summed_layers,
)
from monitor.wire import DeviceStats, Ingress, Slo, WindowRecord


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
    layer_load: F64 = field(default_factory=lambda: np.empty((0, 3)))
    device_load: F64 = field(default_factory=lambda: np.empty((0, 3)))
    # Per (group, window) aggregates: pool MFU = sum(flops/peak) / sum(busy_s), etc.
    pool_layer_rows: I64 = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    pool_layer_ts: F64 = field(default_factory=lambda: np.empty(0))
    pool_layer_values: F64 = field(default_factory=lambda: np.empty((0, len(LAYER_METRICS))))
    pool_device_rows: I64 = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    pool_device_ts: F64 = field(default_factory=lambda: np.empty(0))
    pool_device_values: F64 = field(default_factory=lambda: np.empty((0, len(DEVICE_METRICS))))
    pool_layer_load: F64 = field(default_factory=lambda: np.empty((0, 3)))
    pool_device_load: F64 = field(default_factory=lambda: np.empty((0, 3)))
    # Devices behind each pool layer aggregate (those that reported busy time).
    pool_layer_devices: F64 = field(default_factory=lambda: np.empty(0))

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
    kind: str  # duplicate | late | capacity


@dataclass(frozen=True, slots=True)
class Released:
    """Rows a table let go of (expired or evicted); their detector and load-model state
    must be reset before the rows are used again."""

    device_rows: I64
    layer_rows: I64
    groups: I64

    @classmethod
    def of(cls, device_rows: list[int], layer_rows: list[int], groups: list[int]) -> Released:
        """From lists of row ids."""
        return cls(*(np.array(r, dtype=np.int64) for r in (device_rows, layer_rows, groups)))

    def rows_of(self, kind: StreamKind) -> I64:
        """The released rows of one stream kind's detector."""
        if kind.aggregate:
            return self.groups
        return self.layer_rows if kind.columns == LAYER_METRICS else self.device_rows

    def __bool__(self) -> bool:
        return bool(self.device_rows.size or self.layer_rows.size or self.groups.size)


def _fit(arr: F64, n: int) -> F64:
    """`arr` with room for `n` entries (doubling; new entries NaN = not in use)."""
    return grown(arr, n, np.nan)


def _fit_mask(arr: I64, n: int) -> I64:
    """`arr` with room for `n` masks (doubling; new entries 0 = no field known)."""
    return grown(arr, n, 0)


@dataclass(frozen=True, slots=True)
class _Columns:
    """One batch's raw columns before they become matrices (`StreamTable._collect`): per
    layer entry (row, time, counters, peak, family group, its record's index) and per record."""

    lrows: I64
    lts: F64
    lraw: F64  # (n, len(LAYER_INPUTS)), NaN = not measured
    lpeak: F64
    lgroup: I64
    lrec: I64  # each layer entry's record (index into the per-record columns)
    kchanges: list[tuple[int, float, str | None, str]]
    drows: I64
    dts: F64
    dwin: F64
    dpeak: F64
    dflops: F64
    draw: F64  # (m, len(DEVICE_METRICS) - 1)
    dgroup: I64
    dload: F64  # (m, 3): batch, req_rate, busy fraction (`utilisation`)
    lkernel: Bools  # whether each layer entry named a kernel (`coverage`)


# Attribute getters run by `map` in C: one call per field over a whole batch, no Python
# frame per record or layer.
_LAYERS = attrgetter("layers")
_TYPE = attrgetter("type")
_KERNEL = attrgetter("kernel")
_INPUTS = attrgetter(*LAYER_INPUTS)
_TS, _WINDOW_S = attrgetter("ts"), attrgetter("window_s")
_ROW, _PEAK = attrgetter("row"), attrgetter("peak")
# Device columns after device_mfu, by the sub-record that carries them.
_STATS_FIELDS = ("clock_mhz", "temp_c", "power_w")
_INGRESS_FIELDS = ("req_rate", "queue_depth", "queue_wait_ms", "batch")
# `errors` (a count) becomes the column `error_rate` (per request) in `_frame`.
_SLO_FIELDS = ("lat_p50_ms", "lat_p95_ms", "lat_p99_ms", "quality", "errors")
if ("device_mfu", *_STATS_FIELDS, *_INGRESS_FIELDS, *_SLO_FIELDS[:-1], "error_rate") != (
    DEVICE_METRICS
):
    raise ImportError("device columns no longer match DEVICE_METRICS")  # pragma: no cover
_STATS, _INGRESS, _SLO = (attrgetter(*f) for f in (_STATS_FIELDS, _INGRESS_FIELDS, _SLO_FIELDS))
_NO_STATS, _NO_INGRESS, _NO_SLO = DeviceStats(), Ingress(), Slo()  # every field None
_BATCH, _REQ_RATE = _INGRESS_FIELDS.index("batch"), _INGRESS_FIELDS.index("req_rate")
_ERRORS = DEVICE_METRICS.index("error_rate")
_BUSY = LAYER_INPUTS.index("busy_s")
_DEVICE_RAW_FIELDS = (*_STATS_FIELDS, *_INGRESS_FIELDS, *_SLO_FIELDS)
_INGRESS_AT = slice(len(_STATS_FIELDS), len(_STATS_FIELDS) + len(_INGRESS_FIELDS))


def _intern(name: str | None) -> str | None:
    """`name` as the one interned string of its value (None stays None)."""
    return None if name is None else sys.intern(name)


def _device_raw(rec: WindowRecord) -> chain[float | None]:
    """A record's device columns after device_mfu, in order (None: not measured)."""
    return chain(
        _STATS(_NO_STATS if rec.device_stats is None else rec.device_stats),
        _INGRESS(_NO_INGRESS if rec.ingress is None else rec.ingress),
        _SLO(_NO_SLO if rec.slo is None else rec.slo),
    )


class _Device(msgspec.Struct, gc=False):
    """One device's registry entry. A struct untracked by the cycle collector (it holds
    only strings and numbers): one per device, which full collections would walk."""

    row: int
    host: str | None
    pool: str | None
    model: str | None
    hw: str | None
    dtype: str | None
    peak: float
    last_ts: float = -np.inf
    window_s: float = 10.0


# (pool, model, layer, hw); layer "" = device level. Hardware is part of the key because a
# pool aggregate is only a level to compare with its own history over one population: in a
# pool mixing A100 and H100 hosts the pooled MFU moves whenever the two shares of work move.
GroupKey = tuple[str | None, str | None, str, str | None]


def _gkey(k: tuple[str | None, str | None, str, str | None]) -> GroupKey:
    """A group key back from its decoded form."""
    return (k[0], k[1], k[2], k[3])


class _HasFamily(Protocol):
    """What a group key is made of: a device (`_Device`) or a record (`WindowRecord`)."""

    @property
    def pool(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def hw(self) -> str | None: ...


# The device-level group of devices that send only the whole-device layer `all` (a
# dcgm-exporter sidecar): their device MFU is an estimate from tensor-pipe activity, not
# a sum of counted per-layer FLOPs, so one pool's two kinds of devices are two families,
# with their own pool aggregates, load models and warm starts (`device_group_layer`).
COARSE_DEVICE_GROUP = "device:all"
DEVICE_GROUPS = ("", COARSE_DEVICE_GROUP)


def device_group_layer(rec: WindowRecord) -> str:
    """The layer part of a record's device-level group key: "" unless every layer is `all`."""
    coarse = bool(rec.layers) and all(la.type == COARSE_LAYER for la in rec.layers)
    return COARSE_DEVICE_GROUP if coarse else ""


@dataclass
class StreamTable:
    """Registry of streams and their metadata; builds Frames from decoded records."""

    catalog: Catalog
    ttl_s: float = 3600.0
    # Caps on what the table tracks (None: no cap); at a cap the least recently seen are
    # evicted for new ones (`_Room`).
    max_devices: int | None = None
    max_streams: int | None = None  # layer streams
    max_groups: int | None = None
    devices: dict[str, _Device] = field(default_factory=dict)
    device_names: list[str | None] = field(default_factory=list)
    layer_index: LayerIndex = field(default_factory=LayerIndex)
    last_kernel: list[str | None] = field(default_factory=list)
    free_device_rows: list[int] = field(default_factory=list)
    free_layer_rows: list[int] = field(default_factory=list)
    unknown_hw: Counter[str] = field(default_factory=Counter)
    groups: dict[GroupKey, int] = field(default_factory=dict)
    group_keys: list[GroupKey | None] = field(default_factory=list)
    free_groups: list[int] = field(default_factory=list)
    # Groups created since the last `take_created` (a new pool, model version or layer).
    created: list[int] = field(default_factory=list)
    newly_unknown: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    # Per row: the newest window time (NaN: row free), what expiry and eviction go by.
    device_seen: F64 = field(default_factory=lambda: np.empty(0))
    layer_seen: F64 = field(default_factory=lambda: np.empty(0))
    group_seen: F64 = field(default_factory=lambda: np.empty(0))
    # Per device row: the fields its newest window record carried (`coverage`); -1 unknown.
    device_fields: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Each group's newest window while it may still grow (`OpenWindows`; not checkpointed).
    layer_windows: OpenWindows = field(default_factory=OpenWindows)
    device_windows: OpenWindows = field(default_factory=OpenWindows)
    # Rows (device, layer, group) evicted since the last `take_evicted`.
    _evicted_rows: tuple[list[int], list[int], list[int]] = field(
        default_factory=lambda: ([], [], [])
    )

    # -- registry ----------------------------------------------------------------
    def _device(self, rec: WindowRecord) -> _Device:
        dev = self.devices.get(rec.device)
        if dev is None:
            row = self.free_device_rows.pop() if self.free_device_rows else len(self.device_names)
            if row == len(self.device_names):
                self.device_names.append(rec.device)
            else:
                self.device_names[row] = rec.device
            self.device_seen = _fit(self.device_seen, row + 1)
            self.device_seen[row] = -np.inf
            dev = _Device(row, None, None, None, None, None, np.nan)
            self.devices[rec.device] = dev
        if dev.hw != rec.hw or dev.dtype != rec.dtype:
            peak = self.catalog.peak_flops(rec.hw, rec.dtype)
            dev.hw, dev.dtype = _intern(rec.hw), _intern(rec.dtype)
            dev.peak = np.nan if peak is None else peak
            if peak is None and rec.device not in self.unknown_hw:
                self.newly_unknown.append((rec.device, rec.hw, rec.dtype))
        if np.isnan(dev.peak):
            self.unknown_hw[rec.device] += 1
        # Names shared by many devices are held once (interned), not once per device: a
        # decoded record's strings are its own. Compared first: most records change none.
        if dev.host != rec.host:
            dev.host = _intern(rec.host)
        if dev.pool != rec.pool:
            dev.pool = _intern(rec.pool)
        if dev.model != rec.model:
            dev.model = _intern(rec.model)
        dev.window_s = rec.window_s
        return dev

    def _layer_row(self, dev_row: int, layer: str) -> int:
        index = self.layer_index
        row = index.get((dev_row, layer))
        if row is None:
            row = self.free_layer_rows.pop() if self.free_layer_rows else index.end
            if row == len(self.last_kernel):
                self.last_kernel.append(None)
            else:
                self.last_kernel[row] = None
            index.add(dev_row, layer, row)
            self.layer_seen = _fit(self.layer_seen, row + 1)
            self.layer_seen[row] = -np.inf
        return row

    @staticmethod
    def _group_key(dev: _HasFamily, layer: str) -> GroupKey:
        """The group of a device's `layer` streams (layer "" is the device-level group): the
        one place a group key is made, from a device or from a record about to become one.
        A key depends on the device only through its device-level key, which `_collect`
        uses as the device's family."""
        return (dev.pool, dev.model, layer, dev.hw)

    def _group_id(self, dev: _HasFamily, layer: str) -> int:
        """Id of the group of a device's `layer` streams, a new one if it has none."""
        return self.group(*self._group_key(dev, layer))

    def group(self, pool: str | None, model: str | None, layer: str, hw: str | None = None) -> int:
        """Id of the (pool, model, layer, hw) group; layer "" is the device-level group."""
        key = (pool, model, layer, hw)
        gid = self.groups.get(key)
        if gid is None:
            gid = self.free_groups.pop() if self.free_groups else len(self.group_keys)
            if gid == len(self.group_keys):
                self.group_keys.append(key)
            else:
                self.group_keys[gid] = key
            self.groups[key] = gid
            self.group_seen = _fit(self.group_seen, gid + 1)
            self.group_seen[gid] = -np.inf
            self.created.append(gid)
        return gid

    def take_created(self) -> list[int]:
        """Groups created since the last call (that still exist)."""
        out = [g for g in self.created if self.group_keys[g] is not None]
        self.created = []
        return out

    def predecessor(self, gid: int) -> int | None:
        """The device-level group a new model version's device-level group follows: same
        pool and hardware, another model, the most recently seen (None: none, or a layer
        group: per-layer efficiency is the model's own and is learned afresh). `all`-only
        devices' group follows theirs (`COARSE_DEVICE_GROUP`)."""
        pool, model, layer, hw = self.group_key(gid)
        if layer not in DEVICE_GROUPS:
            return None
        best, seen = None, -np.inf
        for (p, m, la, h), g in self.groups.items():
            if g != gid and p == pool and la == layer and h == hw and m != model:
                t = self.group_seen[g]
                if best is None or t > seen:
                    best, seen = g, t
        return best

    def gids_of(self, pool: str | None, model: str | None, layer: str) -> list[int]:
        """Ids of the groups of (pool, model, layer) over every hardware kind."""
        want = (pool, model, layer)
        return [g for (p, m, la, _hw), g in self.groups.items() if (p, m, la) == want]

    def group_key(self, gid: int) -> GroupKey:
        """(pool, model, layer, hw) of a group in use."""
        key = self.group_keys[gid]
        if key is None:
            raise KeyError(gid)
        return key

    def device_of_layer_row(self, row: int) -> tuple[str, str]:
        """(device id, layer type) of a layer stream row."""
        key = self.layer_index.key(row)
        if key is None:
            raise KeyError(row)
        name = self.device_names[key[0]]
        assert name is not None  # noqa: S101 - rows in use always have a name
        return name, key[1]

    # -- batch -> frame ------------------------------------------------------------
    def build(self, records: list[WindowRecord]) -> tuple[Frame, list[Rejection]]:
        """Register streams, drop duplicates/late records, and derive the metric matrices.

        Rows evicted to make room are reused at once: take them (`take_evicted`) and reset
        their detector state before the frame is detected on.
        """
        accepted, rejections = self._accept(records)
        return self._frame(self._collect(accepted)), rejections

    def _accept(
        self, records: list[WindowRecord]
    ) -> tuple[list[tuple[WindowRecord, _Device]], list[Rejection]]:
        """Records in event-time order, less duplicates, windows not newer than their
        stream's last and what does not fit under the caps; the devices' last window times
        advance."""
        rejections: list[Rejection] = []
        order = sorted(range(len(records)), key=list(map(_TS, records)).__getitem__)
        seen: dict[tuple[str, float], int] = {}
        picked: list[int] = []
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
            picked.append(i)
        if self._over_caps(records, picked):
            picked = _Room(self, records, picked).make(rejections)
        accepted = [(records[i], self._device(records[i])) for i in picked]
        for rec, dev in accepted:
            dev.last_ts = max(dev.last_ts, rec.ts)
        return accepted, rejections

    # -- caps ----------------------------------------------------------------------------
    def _over_caps(self, records: list[WindowRecord], picked: list[int]) -> bool:
        """Whether this batch might not fit under the caps, from cheap upper bounds on what
        it adds (the exact count costs a look-up per layer, `_Room`): a new device per
        record, a new stream per layer, and every pairing of its records' families with
        its layer types (and the device level, two of them where some record sends only
        "all": those devices are a device-level family of their own) a new group."""
        if self.max_devices is None and self.max_streams is None and self.max_groups is None:
            return False
        layers = [records[i].layers for i in picked]
        n_layers = sum(map(len, layers))
        if _over(self.max_devices, len(self.devices) + len(picked)) or _over(
            self.max_streams, len(self.layer_index) + n_layers
        ):
            return True
        if not _over(self.max_groups, len(self.groups) + n_layers + len(picked)):
            return False
        families = {self._group_key(records[i], "") for i in picked}
        types = set(map(_TYPE, chain.from_iterable(layers)))
        levels = 1 + (COARSE_LAYER in types)
        return _over(self.max_groups, len(self.groups) + len(families) * (len(types) + levels))

    def evict(self, kind: str, rows: list[int]) -> None:
        """Let go of live devices, layer streams or groups (`kind`) by row, as expiry does,
        and note them for `take_evicted`."""
        dev_rows, layer_rows, groups = self._evicted_rows
        if kind == "device":
            layer_rows.extend(self._drop_devices(rows))
            dev_rows.extend(rows)
        elif kind == "layer":
            self._drop_layers(rows)
            layer_rows.extend(rows)
        else:
            self._drop_groups(rows)
            groups.extend(rows)

    def take_evicted(self) -> Released:
        """Rows evicted since the last call (their state must be reset before reuse)."""
        out = Released.of(*self._evicted_rows)
        self._evicted_rows = ([], [], [])
        return out

    def _drop_devices(self, rows: list[int]) -> list[int]:
        """Free device rows and their layer rows; returns the layer rows freed."""
        for row in rows:
            name = self.device_names[row]
            assert name is not None  # noqa: S101 - only rows in use are dropped
            del self.devices[name]
            self.device_names[row] = None
            self.unknown_hw.pop(name, None)
        self.device_seen[rows] = np.nan
        self.device_fields[[r for r in rows if r < self.device_fields.size]] = 0
        self.free_device_rows.extend(rows)
        layer_rows = self.layer_index.rows_of_devices(rows)
        self._drop_layers(layer_rows)
        return layer_rows

    def _drop_layers(self, rows: list[int]) -> None:
        self.layer_index.remove(rows)  # only rows in use are dropped
        for row in rows:
            self.last_kernel[row] = None
        self.layer_seen[rows] = np.nan
        self.free_layer_rows.extend(rows)

    def _drop_groups(self, gids: list[int]) -> None:
        self.layer_windows.forget(gids)
        self.device_windows.forget(gids)
        for gid in gids:
            del self.groups[self.group_key(gid)]
            self.group_keys[gid] = None
        self.group_seen[gids] = np.nan
        self.free_groups.extend(gids)

    def _collect(self, accepted: list[tuple[WindowRecord, _Device]]) -> _Columns:
        """The batch's raw columns, without a Python step per layer.

        The layers of all records are flattened once; each field is pulled out of all of
        them by one `map` in C; stream rows, groups and kernel changes are looked up in C
        or found with numpy, and only what is new (a stream, a group, a kernel) takes a
        Python step of its own.
        """
        recs = [rec for rec, _ in accepted]
        devs = [dev for _, dev in accepted]
        m = len(recs)
        per_rec = list(map(_LAYERS, recs))
        flat = list(chain.from_iterable(per_rec))
        n = len(flat)
        counts = np.fromiter(map(len, per_rec), dtype=np.int64, count=m)
        lrec = np.repeat(np.arange(m, dtype=np.int64), counts)
        types = list(map(_TYPE, flat))
        # Layer types as small codes for this batch (a handful of distinct names).
        type_code = {t: k for k, t in enumerate(dict.fromkeys(types))}
        tcodes = np.fromiter(map(type_code.__getitem__, types), dtype=np.int64, count=n)
        drows = np.fromiter(map(_ROW, devs), dtype=np.int64, count=m)
        dts = np.fromiter(map(_TS, recs), dtype=np.float64, count=m)
        lrows = self._layer_rows(drows[lrec], tcodes, list(type_code))
        is_all = tcodes == type_code.get(COARSE_LAYER, -1)
        # Records whose every layer is `all` (a dcgm-exporter's): their own device family.
        coarse = (counts > 0) & (np.bincount(lrec, weights=~is_all, minlength=m) == 0)
        lgroup, dgroup = self._group_ids(devs, list(type_code), tcodes, counts, lrec, coarse)
        # None -> NaN: not measured. One flat list of numbers, not a list of tuples: numpy
        # converts it in one pass instead of two (the shape found first), each pass a walk
        # over objects long out of cache: 2-3x less time (bench.stages).
        lraw = np.array(list(chain.from_iterable(map(_INPUTS, flat))),
                        dtype=np.float64).reshape(n, len(LAYER_INPUTS))  # fmt: skip
        draw = np.array(list(chain.from_iterable(map(_device_raw, recs))),
                        dtype=np.float64).reshape(m, len(_DEVICE_RAW_FIELDS))  # fmt: skip
        ingress = draw[:, _INGRESS_AT]
        dwin = np.fromiter(map(_WINDOW_S, recs), dtype=np.float64, count=m)
        dpeak = np.fromiter(map(_PEAK, devs), dtype=np.float64, count=m)
        kernels = list(map(_KERNEL, flat))
        return _Columns(
            lrows=lrows,
            lts=dts[lrec],
            lraw=lraw,
            lpeak=dpeak[lrec],
            lgroup=lgroup,
            lrec=lrec,
            kchanges=self._kernel_changes(lrows, kernels, dts[lrec]),
            drows=drows,
            dts=dts,
            dwin=dwin,
            dpeak=dpeak,
            dflops=_device_sum(lraw[:, _FLOPS], is_all, lrec, m),
            draw=draw,
            dgroup=dgroup,
            dload=np.column_stack(
                [
                    ingress[:, [_BATCH, _REQ_RATE]],
                    utilisation(_device_sum(lraw[:, _BUSY], is_all, lrec, m), dwin),
                ]
            ),
            lkernel=np.fromiter(map(is_not, kernels, repeat(None)), dtype=bool, count=n),
        )

    def _layer_rows(self, dev_rows: I64, tcodes: I64, type_names: list[str]) -> I64:
        """Each layer entry's stream row (its type `type_names[code]`), new rows in entry
        order for new streams."""
        rows = self.layer_index.lookup(dev_rows, tcodes, type_names)
        for i in np.flatnonzero(rows < 0).tolist():
            rows[i] = self._layer_row(int(dev_rows[i]), type_names[tcodes[i]])
        return rows

    def _group_ids(
        self,
        devs: list[_Device],
        type_names: list[str],
        tcodes: I64,
        counts: I64,
        lrec: I64,
        coarse: Bools,
    ) -> tuple[I64, I64]:
        """Group ids per layer entry and per record, new groups made in the order a walk
        over records (each one's layers, then its device level) would meet them."""
        m, n = len(devs), tcodes.size
        # A record's family (its device-level key) decides its group for every layer type:
        # the device's, `COARSE_DEVICE_GROUP` for a record of layer `all` only.
        level = [COARSE_DEVICE_GROUP if c else "" for c in coarse.tolist()]
        family: dict[GroupKey, int] = {}
        fam = np.fromiter((family.setdefault(self._group_key(d, lv), len(family))
                           for d, lv in zip(devs, level, strict=True)),
                          dtype=np.int64, count=m)  # fmt: skip
        fam_level = [key[2] for key in family]
        width = len(type_names) + 1  # type codes, then the device level
        # (family, layer type) pairs in walk order: record r's layers, then its device level.
        layer_at = np.arange(n, dtype=np.int64) + lrec
        device_at = np.cumsum(counts) + np.arange(m, dtype=np.int64)
        pair = np.empty(n + m, dtype=np.int64)
        pair[layer_at] = fam[lrec] * width + tcodes
        pair[device_at] = fam * width + (width - 1)
        uniq, first, inv = np.unique(pair, return_index=True, return_inverse=True)
        _, one_of = np.unique(fam, return_index=True)  # a record of each family
        gids = np.empty(uniq.size, dtype=np.int64)
        for k in np.argsort(first).tolist():
            f, code = divmod(int(uniq[k]), width)
            layer = type_names[code] if code < width - 1 else fam_level[f]
            gids[k] = self._group_id(devs[int(one_of[f])], layer)
        gid = gids[inv.reshape(-1)]
        return gid[layer_at], gid[device_at]

    def _kernel_changes(
        self, rows: I64, kernels: list[str | None], ts: F64
    ) -> list[tuple[int, float, str | None, str]]:
        """(row, ts, old, new) for each layer entry whose kernel differs from its stream's
        last one, in entry order; an entry without a kernel changes nothing. A stream may
        occur several times in a batch: each entry compares with the one before it."""
        n = len(kernels)
        if n == 0:
            return []
        last = self.last_kernel
        before = list(map(last.__getitem__, rows.tolist()))  # each stream's, before the batch
        # Kernel names as codes for this batch; -1: none.
        code: dict[str | None, int] = {None: -1}
        for name in chain(dict.fromkeys(kernels), dict.fromkeys(before)):
            code.setdefault(name, len(code) - 1)
        names = [name for name in code if name is not None]  # by code
        # Entries grouped by stream (a run), in entry order within each run.
        order = np.argsort(rows, kind="stable")
        run_rows = rows[order]
        new = np.fromiter(map(code.__getitem__, kernels), dtype=np.int64, count=n)[order]
        start = np.fromiter(map(code.__getitem__, before), dtype=np.int64, count=n)[order]
        pos = np.arange(n)
        opens = np.r_[True, run_rows[1:] != run_rows[:-1]]
        run_start = np.maximum.accumulate(np.where(opens, pos, 0))
        has = new >= 0
        latest = np.maximum.accumulate(np.where(has, pos, -1))  # last entry with a kernel
        prev = np.r_[-1, latest[:-1]]
        # The kernel an entry is compared with: the run's nearest earlier one, else the
        # stream's before the batch.
        old = np.where(prev >= run_start, new[np.maximum(prev, 0)], start)
        changed = has & (new != old)
        if not changed.any():
            return []
        # A stream whose kernel changed keeps its run's last kernel.
        closes = np.r_[opens[1:], True]
        touched = np.maximum.accumulate(np.where(changed, pos, -1)) >= run_start
        for j in np.flatnonzero(closes & touched).tolist():
            # Interned: one string per kernel name, not one per stream that runs it.
            last[int(run_rows[j])] = sys.intern(names[int(new[latest[j]])])
        said = np.flatnonzero(changed & (old >= 0))
        said = said[np.argsort(order[said])]  # back to entry order
        return [
            (row, t, names[o], names[c])
            for row, t, o, c in zip(run_rows[said].tolist(), ts[order[said]].tolist(),
                                    old[said].tolist(), new[said].tolist(), strict=True)
        ]  # fmt: skip

    def _frame(self, c: _Columns) -> Frame:
        """Metric matrices and pool aggregates from the raw columns (vectorised)."""
        raw, peak = c.lraw, c.lpeak
        lvals = layer_metrics(raw, peak)
        dvals = np.empty((c.drows.size, len(DEVICE_METRICS)))
        dvals[:, 0] = device_mfu(c.dflops, c.dwin, c.dpeak)
        dvals[:, 1:] = c.draw
        dvals[:, _ERRORS] = error_rate(dvals[:, _ERRORS], c.dload[:, 1], c.dwin)
        layer_ts, device_ts = c.lts, c.dts
        layer_group, device_group = c.lgroup, c.dgroup
        device_load = c.dload
        layer_load = device_load[c.lrec]
        layer_rows, device_rows = c.lrows, c.drows
        np.maximum.at(self.layer_seen, layer_rows, layer_ts)
        np.maximum.at(self.device_seen, device_rows, device_ts)
        np.maximum.at(self.group_seen, layer_group, layer_ts)
        np.maximum.at(self.group_seen, device_group, device_ts)
        self._note_fields(c, raw, dvals[:, 1:], layer_group, device_rows)
        # Aggregates of complete windows only (`OpenWindows`); load columns ride along.
        pl_rows, pl_ts, sums, counts = self.layer_windows.take(
            layer_group, layer_ts, np.hstack([per_peak(raw, peak), layer_load])
        )
        k = len(LAYER_INPUTS)
        pd_rows, pd_ts, dsums, dcounts = self.device_windows.take(
            device_group, device_ts, np.hstack([dvals, device_load])
        )
        d = len(DEVICE_METRICS)
        with np.errstate(invalid="ignore", divide="ignore"):
            pl_load, means = sums[:, k:] / counts[:, k:], dsums / dcounts
        return Frame(
            layer_rows=layer_rows,
            layer_ts=layer_ts,
            layer_values=lvals,
            device_rows=device_rows,
            device_ts=device_ts,
            device_values=dvals,
            kernel_changes=c.kchanges,
            layer_group=layer_group,
            device_group=device_group,
            layer_load=layer_load,
            device_load=device_load,
            pool_layer_rows=pl_rows,
            pool_layer_ts=pl_ts,
            pool_layer_values=layer_metrics(
                summed_layers(sums[:, :k], counts[:, :k]), np.ones(pl_rows.size)
            ),
            pool_device_rows=pd_rows,
            pool_device_ts=pd_ts,
            pool_device_values=means[:, :d],
            pool_layer_load=pl_load,
            pool_device_load=means[:, d:],
            pool_layer_devices=counts[:, _BUSY],
        )

    def _note_fields(
        self, c: _Columns, raw: F64, device_raw: F64, layer_group: I64, device_rows: I64
    ) -> None:
        """Each device's field mask from its newest record in the batch (`coverage`)."""
        if not device_rows.size:
            return
        used = np.unique(layer_group).tolist()
        coarse = [g for g in used if self.group_key(g)[2] == COARSE_LAYER]
        typed = ~np.isin(layer_group, coarse) if coarse else np.ones(layer_group.size, bool)
        masks = record_masks(
            raw,
            typed,
            np.flatnonzero(c.lkernel),
            c.lrec,
            device_raw,
        )
        # Records are in event-time order: each device's last one is its newest.
        _, last_rev = np.unique(device_rows[::-1], return_index=True)
        last = device_rows.size - 1 - last_rev
        self.device_fields = _fit_mask(self.device_fields, int(device_rows.max()) + 1)
        self.device_fields[device_rows[last]] = masks[last]

    def members(self, gid: int, *, device_level: bool) -> int:
        """Devices behind a group's aggregate: the most that reported one of its windows
        (`OpenWindows.members`; 0: none yet)."""
        m = (self.device_windows if device_level else self.layer_windows).members
        return int(m[gid]) if gid < m.size else 0

    def fields_of(self, device: str) -> int | None:
        """The field mask of a device's newest record (`coverage`); None if not tracked."""
        dev = self.devices.get(device)
        if dev is None or dev.row >= self.device_fields.size or self.device_fields[dev.row] < 0:
            return None
        return int(self.device_fields[dev.row])

    # -- expiry ------------------------------------------------------------------------
    def expire(self, now_ts: float) -> Released:
        """Drop devices and groups silent for longer than ttl; return the rows freed."""
        gone = [d.row for d in self.devices.values() if now_ts - d.last_ts > self.ttl_s]
        layer_rows = self._drop_devices(gone)
        with np.errstate(invalid="ignore"):
            groups = np.flatnonzero(now_ts - self.group_seen > self.ttl_s).tolist()
        self._drop_groups(groups)
        return Released.of(gone, layer_rows, groups)

    # -- checkpoint ----------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """Registry state as bytes (restored by `restore`); dict orders are kept."""
        return _table_encoder.encode(
            _TableState(
                self.ttl_s,
                [_device_row(name, d) for name, d in self.devices.items()],
                self.device_names,
                [],  # the (device, type) -> row index, as lists before `layer_index` columns
                [],
                self.last_kernel,
                self.free_device_rows,
                self.free_layer_rows,
                list(self.unknown_hw.items()),
                self.group_keys,
                self.free_groups,
                self.layer_seen[: self.layer_index.end].tobytes(),
                self.group_seen[: len(self.group_keys)].tobytes(),
                _fit_mask(self.device_fields, len(self.device_names))[
                    : len(self.device_names)
                ].tobytes(),
                *self.layer_index.columns(),
            )
        )

    @classmethod
    def restore(
        cls,
        blob: bytes,
        catalog: Catalog,
        ttl_s: float | None = None,
        max_devices: int | None = None,
        max_streams: int | None = None,
        max_groups: int | None = None,
    ) -> StreamTable:
        """Rebuild a table from `snapshot` bytes under these TTL and caps (the configured
        ones win after a restart; `ttl_s` None: the checkpoint's). Over a lower cap, the
        next batch evicts down to it."""
        s = msgspec.msgpack.decode(blob, type=_TableState)
        t = cls(
            catalog=catalog,
            ttl_s=s.ttl_s if ttl_s is None else float(ttl_s),
            devices={d[0]: _device_of(d) for d in s.devices},
            device_names=s.device_names,
            layer_index=(
                _index_of(s.layer_index, len(s.layer_keys))  # written before the grid
                if s.layer_keys
                else LayerIndex.from_columns(
                    s.layer_dev, s.layer_col, s.layer_types, s.layer_spilled
                )
            ),
            last_kernel=s.last_kernel,
            free_device_rows=s.free_device_rows,
            free_layer_rows=s.free_layer_rows,
            unknown_hw=Counter(dict(s.unknown_hw)),
            groups={_gkey(k): i for i, k in enumerate(s.group_keys) if k is not None},
            group_keys=[None if k is None else _gkey(k) for k in s.group_keys],
            free_groups=s.free_groups,
            max_devices=max_devices,
            max_streams=max_streams,
            max_groups=max_groups,
        )
        t.device_seen = _fit(t.device_seen, len(t.device_names))
        for d in t.devices.values():
            t.device_seen[d.row] = d.last_ts
        t.layer_seen = _fit(t.layer_seen, t.layer_index.end)
        t.group_seen = _fit(t.group_seen, len(t.group_keys))
        if s.layer_seen:
            t.layer_seen[: t.layer_index.end] = np.frombuffer(s.layer_seen, dtype=np.float64)
        elif t.layer_index:  # written before per-row times were kept: each stream's device's
            live = np.array(list(t.layer_index.values()), dtype=np.int64)
            t.layer_seen[live] = t.device_seen[t.layer_index.row_device[live]]
        t.device_fields = _fit_mask(t.device_fields, len(t.device_names))
        if s.device_fields:
            t.device_fields[: len(t.device_names)] = np.frombuffer(s.device_fields, np.int64)
        else:  # an older checkpoint: unknown (-1) until each device's next record
            t.device_fields[: len(t.device_names)] = -1
        if s.group_seen:
            t.group_seen[: len(t.group_keys)] = np.frombuffer(s.group_seen, dtype=np.float64)
        elif t.groups:  # ... and every group lives until its partition's newest window has expired
            newest = max((d.last_ts for d in t.devices.values()), default=-np.inf)
            t.group_seen[list(t.groups.values())] = newest
        return t


def _index_of(entries: list[tuple[int, str, int]], end: int) -> LayerIndex:
    """An older checkpoint's (device row, layer type, row) entries as an index of `end`
    rows."""
    index = LayerIndex()
    index.reserve(end)
    for dev_row, layer, row in entries:
        index.add(dev_row, layer, row)
    return index


_FLOPS = LAYER_INPUTS.index("flops")


def utilisation(busy_s: F64, window_s: F64) -> F64:
    """Busy fraction of each window: device busy seconds over its length, at most 1
    (layers that overlap, a collective beside compute, can sum past it); NaN: not
    measured."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out: F64 = np.minimum(busy_s / window_s, 1.0)
    return out


def _device_sum(values: F64, is_all: Bools, lrec: I64, m: int) -> F64:
    """Per record: the sum of its layers' values (flops, busy seconds), or where none has
    any, its "all" layer's (an exporter that knows only device counters sends one layer
    "all"); NaN: neither.

    `bincount` adds each record's terms one by one in layer order, from 0.0, as a walk
    over the layers would, so the sums are bit for bit the same.
    """
    part = ~is_all & ~np.isnan(values)
    total = np.bincount(lrec, weights=np.where(part, values, 0.0), minlength=m)
    summed = np.bincount(lrec, weights=part, minlength=m) > 0
    whole = np.full(m, np.nan)
    alls = is_all & ~np.isnan(values)
    whole[lrec[alls]] = values[alls]  # types are unique per record: one "all" at most
    out: F64 = np.where(summed, total, whole)
    return out


def _over(cap: int | None, n: int) -> bool:
    return cap is not None and n > cap


class _Room:
    """Room for one batch under a table's caps.

    Evicts the least recently seen devices, layer streams and groups that the batch does
    not use, as many as its new ones need; then rejects the records that still do not fit
    (only when one batch alone brings more new ones than a cap allows).
    """

    def __init__(self, table: StreamTable, records: list[WindowRecord], picked: list[int]):
        self.t, self.records, self.picked = table, records, picked
        # Per picked record: its device if new, and its new layer and group keys.
        self.new: list[tuple[str | None, list[tuple[str, str]], list[GroupKey]]] = []
        self.keep: dict[str, set[int]] = {"device": set(), "layer": set(), "group": set()}
        for i in picked:
            self._scan(records[i])

    def _scan(self, rec: WindowRecord) -> None:
        t, keep = self.t, self.keep
        dev = t.devices.get(rec.device)
        new_layers: list[tuple[str, str]] = []
        new_groups: list[GroupKey] = []
        if dev is not None:
            keep["device"].add(dev.row)
        for layer in rec.layers:
            row = None if dev is None else t.layer_index.get((dev.row, layer.type))
            if row is None:
                new_layers.append((rec.device, layer.type))
            else:
                keep["layer"].add(row)
        for gkey in [t._group_key(rec, device_group_layer(rec)),
                     *(t._group_key(rec, la.type) for la in rec.layers)]:  # fmt: skip
            gid = t.groups.get(gkey)
            if gid is None:
                new_groups.append(gkey)
            else:
                keep["group"].add(gid)
        self.new.append((rec.device if dev is None else None, new_layers, new_groups))

    def make(self, rejections: list[Rejection]) -> list[int]:
        """The records that fit, after evicting what they need room for."""
        t = self.t
        new_devices = {d for d, _, _ in self.new if d is not None}
        new_layers = {k for _, ks, _ in self.new for k in ks}
        new_groups = {k for _, _, ks in self.new for k in ks}
        # Devices first: an evicted device's layer streams go with it.
        self._evict("device", t.max_devices, len(t.devices) + len(new_devices))
        self._evict("layer", t.max_streams, len(t.layer_index) + len(new_layers))
        self._evict("group", t.max_groups, len(t.groups) + len(new_groups))
        if not (_over(t.max_devices, len(t.devices) + len(new_devices))
                or _over(t.max_streams, len(t.layer_index) + len(new_layers))
                or _over(t.max_groups, len(t.groups) + len(new_groups))):  # fmt: skip
            return self.picked
        return self._admit(rejections)

    def _evict(self, kind: str, cap: int | None, n: int) -> None:
        """Evict the `n - cap` least recently seen of `kind` outside this batch (all there
        are, if fewer)."""
        if cap is None or n <= cap:
            return
        seen = {"device": self.t.device_seen, "layer": self.t.layer_seen,
                "group": self.t.group_seen}[kind]  # fmt: skip
        live = np.flatnonzero(~np.isnan(seen))
        keep = self.keep[kind]
        if keep:
            live = live[~np.isin(live, np.fromiter(keep, dtype=np.int64, count=len(keep)))]
        lru = live[np.argsort(seen[live], kind="stable")[: n - cap]]
        self.t.evict(kind, lru.tolist())

    def _admit(self, rejections: list[Rejection]) -> list[int]:
        """Records in event order while their new streams fit; the rest are rejected."""
        t = self.t
        caps = {"max_devices": t.max_devices, "max_streams": t.max_streams,
                "max_groups": t.max_groups}  # fmt: skip
        used = {"max_devices": len(t.devices), "max_streams": len(t.layer_index),
                "max_groups": len(t.groups)}  # fmt: skip
        taken: tuple[set[str], set[tuple[str, str]], set[GroupKey]] = (set(), set(), set())
        out: list[int] = []
        for i, (device, layers, groups) in zip(self.picked, self.new, strict=True):
            add_d = {device} - taken[0] if device is not None else set()
            add_l, add_g = set(layers) - taken[1], set(groups) - taken[2]
            adds = {"max_devices": len(add_d), "max_streams": len(add_l),
                    "max_groups": len(add_g)}  # fmt: skip
            full = [k for k, cap in caps.items() if _over(cap, used[k] + adds[k])]
            if full:
                rec = self.records[i]
                limits = ", ".join(f"limits.{k}={caps[k]}" for k in full)
                reason = (
                    f"capacity: no room for device {rec.device}'s new streams under "
                    f"{limits} (every stream its partition tracks is in this batch)"
                )
                rejections.append(Rejection(i, reason, "capacity"))
                continue
            for k, n in adds.items():
                used[k] += n
            taken[0].update(add_d)
            taken[1].update(add_l)
            taken[2].update(add_g)
            out.append(i)
        return out


_DeviceRow = tuple[
    str, int, str | None, str | None, str | None, str | None, str | None, float, float, float
]


def _device_row(name: str, d: _Device) -> _DeviceRow:
    return (name, d.row, d.host, d.pool, d.model, d.hw, d.dtype, d.peak, d.last_ts, d.window_s)


def _device_of(r: _DeviceRow) -> _Device:
    """A device back from its checkpoint row, its names interned (`_intern`)."""
    host, pool, model, hw, dtype = map(_intern, r[2:7])
    return _Device(r[1], host, pool, model, hw, dtype, r[7], r[8], r[9])


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
    group_keys: list[tuple[str | None, str | None, str, str | None] | None]
    # Since per-row times and group expiry; empty in older checkpoints.
    free_groups: list[int] = []
    layer_seen: bytes = b""  # float64 per layer row
    group_seen: bytes = b""  # float64 per group
    device_fields: bytes = b""  # int64 field mask per device row (`coverage`); empty in older
    # The layer index's columns (`LayerIndex.columns`); before them, `layer_index` and
    # `layer_keys` held it as lists (both empty since).
    layer_dev: bytes = b""
    layer_col: bytes = b""
    layer_types: list[str] = []
    layer_spilled: list[tuple[int, str]] = []


_table_encoder = msgspec.msgpack.Encoder()
