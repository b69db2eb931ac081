"""The bank's state: the per-cell layout, growth, expiry and checkpoints.

A `BankCusum` keeps its state flat over cells (cell = row * n_metrics + column): the
scalars of `SCALARS` as one array each, the bank's statistics (2 per shift size), the
smallest member's run lengths (2), and the ring of recent samples; their times are held
per row where a row's cells agree (`bank_times`), and checkpoints hold them per cell.
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from monitor.arrays import I64
from monitor.detect import _blob, bank_ring
from monitor.detect.bank_times import TimeRings
from monitor.detect.base import StateShapeError

if TYPE_CHECKING:
    from monitor.detect.bank import BankCusum

    _Bank = TypeVar("_Bank", bound=BankCusum)

# Per-cell scalars. Their order is the checkpoint's array order.
SCALARS: dict[str, type[np.generic]] = {
    "n": np.int32,  # samples since (re)start: burn-in and youth
    "nb": np.int32,  # samples in the level estimate (saturating)
    "ns": np.int32,  # samples in the scale estimate (kept on re-baseline; 0 = fresh)
    # Samples behind the AR and long-run variance estimates: ns plus a warm start's
    # credit. Until a cell borrows (`BankCusum._split`), na is ns and this array is stale.
    "na": np.int32,
    "fam": np.int32,  # family (the caller's group id + 1; 0 = unknown): warm-start donors
    "pos": np.int32,  # next ring slot
    "mu": np.float64,  # baseline level
    "sig": np.float64,  # innovation scale (1 until the first baseline)
    "phi": np.float32,  # AR(1) coefficient in use (estimate + bias + margin)
    "c0": np.float32,  # EW lag-0 autocovariance of lagged deviations (sigma units)
    "c1": np.float32,  # EW lag-1 autocovariance
    "dprev": np.float32,  # previous deviation (sigma units), for whitening
    "lprev": np.float32,  # previous lagged deviation, for the AR estimate
    "c2": np.float32,  # EW lag-2 autocovariance (sigma units)
    "lprev2": np.float32,  # lagged deviation two samples back
    "jr": np.float32,  # signed run of consecutive windows beyond `jump` marginal sigmas
    "jm": np.float32,  # last window's deviation in marginal sigmas (unclipped), for `jr`
    "vfirst": np.int32,  # `n` at the first spread veto of the current run of vetoes (0: none)
    "vlast": np.int32,  # `n` at the latest spread veto
    "lm": np.float32,  # EW mean (window `lrv_window`) of the lagged, clipped innovations
    "lv": np.float32,  # EW mean square of `lm`: the innovations' long-run variance / L
    "theta": np.float32,  # MA(1) coefficient (0 unless phi came from c2/c1)
    "uprev": np.float32,  # previous ARMA innovation (front-end)
    "ulprev": np.float32,  # previous lagged ARMA innovation (long-run variance)
    # The ring's samples are float16 offsets from an anchor, in units (`bank_ring`).
    "ra": np.float32,  # the ring's anchor
    "rs": np.float32,  # the ring's unit, a power of two (0: no sample yet)
}


def idle(det: BankCusum) -> frozenset[str]:
    """Per-cell scalars the detector's parameters leave unread: the MA term's without it,
    the family without warm starts, the AR count until a cell borrows. Nothing writes
    them while idle, so they stay zeros the kernel never backed (`zeros`): 20 B per cell
    with the defaults. Checkpoints still hold them."""
    out: set[str] = set()
    if det.cfg.ma_max == 0:
        out.update(("theta", "uprev", "ulprev"))
    if det.cfg.warm_start == 0:
        out.add("fam")
    if not det._split:
        out.add("na")
    return frozenset(out)


# Arrays of at least this many bytes get a mapping of their own (`zeros`); smaller ones
# are ordinary allocations.
_MAP_MIN = 1 << 20


def zeros(shape: tuple[int, ...], dtype: type[np.generic]) -> np.ndarray:
    """Zeros whose pages become resident only when written, 4 KiB at a time.

    numpy asks for transparent huge pages on large arrays, so a write into capacity ahead
    of use would make up to 2 MiB of it resident per array row (the rings have 32); a
    mapping of the state's own, without huge pages, keeps unused capacity out of memory.
    """
    dt = np.dtype(dtype)
    size = int(np.prod(shape)) * dt.itemsize
    if size < _MAP_MIN:
        return np.zeros(shape, dtype=dt)
    buf = mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=dt).reshape(shape)


def bytes_per_cell(det: BankCusum) -> int:
    """Bytes of state one (stream, metric) cell occupies, its share of its row's time ring
    included (a cell with a time ring of its own costs `4 * history` more), its idle
    scalars not."""
    unread = idle(det)
    scalars = sum(np.dtype(t).itemsize for name, t in SCALARS.items() if name not in unread)
    # `TimeRings.own`, and a share of the row's ring and position.
    times = 4 + (det.cfg.history * 4 + 4) // det.n_metrics
    ring = det.cfg.history * np.dtype(bank_ring.RING_DTYPE).itemsize
    return scalars + (2 * det.cfg.n_shifts + 2) * 4 + ring + times


def grow(det: BankCusum, need_rows: int) -> None:
    """Make rows below `need_rows` ready for samples (fresh rows: `sig` 1, rings empty)."""
    if need_rows <= det._rows:
        return
    if need_rows > det._cap:
        reserve(det, max(need_rows, 2 * det._cap))
    k = det.n_metrics
    lo, hi = det._rows * k, need_rows * k
    det._s["sig"][lo:hi] = 1.0
    det._ring[:, lo:hi] = np.nan
    det._times.grow(det._rows, need_rows)
    det._rows = need_rows


def reserve(det: BankCusum, cap: int) -> None:
    """Allocate room for `cap` rows, keeping the rows in use.

    Capacity doubles, so up to half of it is ahead of the streams. It is allocated as
    zeros that the kernel backs on first write (`zeros`), and only the rows `grow` hands
    out are written: capacity ahead of use is address space, not resident memory (with
    the rings filled with NaN up to capacity, it was about a third of the memory per
    stream at 100,000 devices).
    """
    if cap <= det._cap:
        return
    used, cells = det._rows * det.n_metrics, cap * det.n_metrics
    s: dict[str, np.ndarray] = {}
    unread = idle(det)
    for name, dt in SCALARS.items():
        arr = zeros((cells,), dt)
        if used and name not in unread:
            arr[:used] = det._s[name][:used]
        s[name] = arr
    bank = zeros((2 * det.cfg.n_shifts, cells), np.float32)
    bank[:, :used] = det._bank[:, :used]
    run = zeros((2, cells), np.float32)
    run[:, :used] = det._run[:, :used]
    ring = zeros((det.cfg.history, cells), bank_ring.RING_DTYPE)
    ring[:, :used] = det._ring[:, :used]
    det._times.reserve(cap, det._rows)
    det._s, det._bank, det._run, det._cap = s, bank, run, cap
    det._ring = ring


def forget(det: BankCusum, rows: I64) -> None:
    """Reset expired streams' slots so a new stream can reuse them."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[(rows >= 0) & (rows < det._rows)]
    if rows.size == 0:
        return
    cells = (rows[:, None] * det.n_metrics + np.arange(det.n_metrics)).ravel()
    unread = idle(det)
    for name, arr in det._s.items():
        if name not in unread:
            arr[cells] = 0
    det._s["sig"][cells] = 1.0  # harmless divisor until the first baseline
    det._bank[:, cells] = 0.0
    det._run[:, cells] = 0.0
    det._ring[:, cells] = np.nan
    det._times.forget(rows)


def copy_rows(det: BankCusum, src: I64, dst: I64) -> None:
    """Rows `dst` take over the whole state of rows `src`: the same stream goes on under
    another row (a new model version's pool aggregate after its predecessor's)."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    if src.size == 0:
        return
    grow(det, int(max(src.max(), dst.max())) + 1)
    k = det.n_metrics
    sc = (src[:, None] * k + np.arange(k)).ravel()
    dc = (dst[:, None] * k + np.arange(k)).ravel()
    unread = idle(det)
    for name, arr in det._s.items():
        if name not in unread:
            arr[dc] = arr[sc]
    for arr in (det._bank, det._run, det._ring):
        arr[:, dc] = arr[:, sc]
    # The time rings are held per row where a row's cells agree: rebuilt from a ring per
    # cell, as a checkpoint's are, with the capacity the bank has.
    pos = det._s["pos"][: det._rows * k]
    tring = det._times.full(det._rows, pos)
    tring[:, dc] = tring[:, sc]
    times = TimeRings.load(tring, pos, k, zeros)
    times.reserve(det._cap, det._rows)
    det._times = times


def rows_in_use(det: BankCusum) -> int:
    """Rows up to the last one that ever saw a sample (later slots are pristine)."""
    cells = det._rows * det.n_metrics
    seen = (det._s["n"][:cells] > 0) | (det._s["ns"][:cells] > 0)
    last = np.flatnonzero(seen)
    return 0 if last.size == 0 else int(last[-1]) // det.n_metrics + 1


def state_arrays(det: BankCusum, rows: int | None = None) -> dict[str, np.ndarray]:
    """State arrays for the first `rows` rows (every row handed out by default)."""
    cells = (det._rows if rows is None else rows) * det.n_metrics
    arrays: dict[str, np.ndarray] = {name: a[:cells] for name, a in det._s.items()}
    if not det._split:
        arrays["na"] = arrays["ns"]  # the AR count is the scale's (not kept apart yet)
    arrays.update(
        bank=det._bank[:, :cells],
        run=det._run[:, :cells],
        ring=det._ring[:, :cells],
        tring=det._times.full(cells // det.n_metrics, det._s["pos"]),
    )
    return arrays


def snapshot(det: BankCusum) -> bytes:
    """All state and parameters as deterministic bytes.

    Only rows in use are written: capacity is pre-allocated (and doubles), so a
    partition with a few devices would otherwise checkpoint megabytes of empty slots.
    """
    rows = rows_in_use(det)
    params = det.params() | {"n_metrics": det.n_metrics, "rows": rows}
    # The time ring's epoch rides along as a one-element array (state, not a parameter).
    arrays = state_arrays(det, rows) | {"tepoch": np.array([det._t0], dtype=np.float64)}
    return _blob.pack(det.kind, params, arrays)


def restore(cls: type[_Bank], blob: bytes, params: Mapping[str, Any] | None = None) -> _Bank:
    """Rebuild a detector of `cls` from `snapshot` bytes; see `BankCusum.restore`."""
    saved, arrays = _blob.unpack(blob, cls.kind)
    n_metrics, rows = int(saved.pop("n_metrics")), int(saved.pop("rows"))
    if params is not None:
        changed = [k for k in cls.STATE_SHAPE if params[k] != saved[k]]
        if changed:
            raise StateShapeError(f"{changed} shape the state: a checkpoint cannot carry over")
        saved = dict(params)
    det = cls(n_metrics, capacity=1, **saved)
    if "rs" not in arrays:
        _anchor_float32_ring(arrays)
    det._s = {name: arrays[name] for name in SCALARS}
    det._split = not np.array_equal(det._s["na"], det._s["ns"])
    if det._split:
        na, ns = det._s["na"], det._s["ns"]
        credit = min(det.cfg.warm_start, det._ns_max)
        det._warm.credit = np.flatnonzero((na > ns) & (ns < credit))
    if params is not None:
        # Shorter windows than the checkpoint's: the counts saturate at the new ones
        # (the per-count tables end there).
        np.minimum(det._s["nb"], det.cfg.baseline_window, out=det._s["nb"])
        np.minimum(det._s["ns"], det._ns_max, out=det._s["ns"])
        np.minimum(det._s["na"], det._ns_max, out=det._s["na"])
    for name in idle(det):
        det._s[name] = zeros((rows * n_metrics,), SCALARS[name])  # unread: leave it unbacked
    det._bank, det._run = arrays["bank"], arrays["run"]
    det._ring = arrays["ring"]
    det._times = TimeRings.load(arrays["tring"], arrays["pos"], n_metrics, zeros)
    det._t0 = float(arrays["tepoch"][0])
    det._cap = det._rows = rows
    return det


def _anchor_float32_ring(arrays: dict[str, np.ndarray]) -> None:
    """A checkpoint written while the ring held float32 samples: anchor each cell (its
    level once baselined, else a sample of its ring) and hold the ring as offsets."""
    ring = arrays["ring"].astype(np.float64)
    ns = arrays["ns"]
    fin = np.isfinite(ring)
    some = ring[np.argmax(fin, axis=0), np.arange(ring.shape[1])]
    sample = np.where(fin.any(axis=0), some, 0.0)
    anchor = np.where(ns > 0, arrays["mu"], sample).astype(np.float32)
    scale = np.where(ns > 0, arrays["sig"], 0.0)
    unit = bank_ring.unit_for_ring(ring, anchor, scale)
    unit[~fin.any(axis=0) & (ns == 0)] = 0.0  # no sample yet: anchored by its first
    arrays["ra"], arrays["rs"] = anchor, unit
    arrays["ring"] = bank_ring.encode(ring, anchor, unit)
