"""Encode a window `Frame` into contract §1 JSON records (one msgspec encoder, lean structs)."""

from __future__ import annotations

import gc

import msgspec
import numpy as np
import numpy.typing as npt

from sim.fleet import Fleet
from sim.physics import Frame


class _Layer(msgspec.Struct):
    type: str
    flops: float
    busy_s: float
    cycles: float
    stall_mem_cycles: float
    occupancy: float
    bytes_hbm: float
    sram_hit: float
    spill_bytes: float
    sync_wait_s: float
    kernel: str
    fallback_frac: float


class _Ingress(msgspec.Struct):
    req_rate: float
    queue_depth: float
    queue_wait_ms: float
    batch: float


class _DeviceStats(msgspec.Struct):
    power_w: float
    temp_c: float
    clock_mhz: float


class _Slo(msgspec.Struct, omit_defaults=True):
    lat_p50_ms: float
    lat_p95_ms: float
    lat_p99_ms: float
    errors: float
    quality: float | None = None  # training pools do not validate per window: not measured


class _Record(msgspec.Struct):
    v: int
    ts: float
    window_s: float
    device: str
    host: str
    pool: str
    model: str
    hw: str
    dtype: str
    ingress: _Ingress
    device_stats: _DeviceStats
    slo: _Slo
    layers: list[_Layer]
    source: str


class Encoder:
    """Turns frames into (key, value) byte pairs; holds the per-device strings once."""

    def __init__(self, fleet: Fleet, window_s: float) -> None:
        self.fleet = fleet
        self.w = window_s
        self._enc = msgspec.json.Encoder()
        self._keys = [d.encode() for d in fleet.device_names]
        self._hosts = [fleet.host_names[h] for h in fleet.host_idx.tolist()]
        pools = fleet.pools
        self._pool = [pools[p].name for p in fleet.pool_idx.tolist()]
        self._hw = fleet.device_hw
        self._dtype = [pools[p].dtype for p in fleet.pool_idx.tolist()]
        self._cols = [
            [int(c) for c in np.flatnonzero(fleet.pool_present[p])] for p in range(len(pools))
        ]
        self._pool_idx = fleet.pool_idx.tolist()
        self._train = fleet.is_train.tolist()

    def encode(self, frame: Frame) -> list[tuple[bytes, bytes]]:
        """Records of the devices that report in `frame`, in device order."""
        # millions of short-lived objects and no cycles: collection passes only cost time
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._encode(frame)
        finally:
            if was_enabled:
                gc.enable()

    def _encode(self, frame: Frame) -> list[tuple[bytes, bytes]]:
        rows = np.flatnonzero(frame.emit)
        f = self.fleet
        raw = np.stack(
            [
                frame.flops,
                frame.busy_s,
                frame.cycles,
                frame.stall,
                frame.occupancy,
                frame.bytes_hbm,
                frame.sram_hit,
                frame.spill,
                frame.sync,
                frame.fallback,
            ],
            axis=2,
        )[rows]
        layer_vals = np.concatenate(
            [
                _sig6(raw[..., :4]),
                np.round(raw[..., 4:5], 4),
                _sig6(raw[..., 5:6]),
                np.round(raw[..., 6:7], 4),
                _sig6(raw[..., 7:9]),
                np.round(raw[..., 9:10], 4),
            ],
            axis=2,
        ).tolist()
        kernels = frame.kernel[rows].tolist()
        dev_vals = np.stack(
            [
                frame.req_rate,
                frame.queue_depth,
                frame.queue_wait_ms,
                frame.batch,
                frame.power_w,
                frame.temp_c,
                frame.clock_mhz,
                frame.p50,
                frame.p95,
                frame.p99,
                frame.errors,
                frame.quality,
            ],
            axis=1,
        )[rows]
        dev_vals = np.round(dev_vals, 3).tolist()
        models = frame.model_row[rows].tolist()
        names = f.layers
        knames = f.kernel_names
        mnames = f.model_names
        ts = frame.ts
        w = self.w
        out: list[tuple[bytes, bytes]] = []
        append = out.append
        enc = self._enc.encode
        for j, d in enumerate(rows.tolist()):
            lv = layer_vals[j]
            kr = kernels[j]
            layers = []
            for c in self._cols[self._pool_idx[d]]:
                x = lv[c]
                layers.append(
                    _Layer(
                        names[c],
                        x[0],
                        x[1],
                        x[2],
                        x[3],
                        x[4],
                        x[5],
                        x[6],
                        x[7],
                        x[8],
                        knames[kr[c]],
                        x[9],
                    )
                )
            dv = dev_vals[j]
            rec = _Record(
                1,
                ts,
                w,
                f.device_names[d],
                self._hosts[d],
                self._pool[d],
                mnames[models[j]],
                self._hw[d],
                self._dtype[d],
                _Ingress(dv[0], dv[1], dv[2], dv[3]),
                _DeviceStats(dv[4], dv[5], dv[6]),
                _Slo(dv[7], dv[8], dv[9], dv[10], None if self._train[d] else dv[11]),
                layers,
                "sim",
            )
            append((self._keys[d], enc(rec)))
        return out


def _sig6(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Round to 6 significant digits so records are short and compress well.

    Monotone, so `stall_mem_cycles <= cycles` survives; powers of ten are exact
    as divisors (small numbers) and as multipliers (large ones), so the decimal
    form stays short.
    """
    mag = np.abs(x)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log10(np.where(mag > 0, mag, 1.0))) - 5.0
    small = np.clip(-e, 0.0, 300.0)
    large = np.clip(e, 0.0, 22.0)
    out: npt.NDArray[np.float64] = np.where(
        e < 0, np.round(x * 10.0**small) / 10.0**small, np.round(x / 10.0**large) * 10.0**large
    )
    return out
