"""What a bank's alarms become: onsets, the spread veto, effect sizes, re-baselines.

Off the hot path: these run over the alarming cells of a wave only.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from monitor.arrays import F32, F64, I64
from monitor.detect import bank_ring
from monitor.detect.base import Detections

if TYPE_CHECKING:
    from monitor.detect.bank import BankCusum

_Mask = npt.NDArray[np.bool_]
# What an alarm (the statistic crossing h, or a jump run) became: a detection, dropped by
# the spread veto (a burst of spread), or a silent re-baseline below `min_rel_change`.
ALARM_OUTCOMES = ("reported", "vetoed", "below_min_change")
_SPREAD_PAIRS = 16  # recent successive differences behind the spread veto
_SPREAD_MIN_PAIRS = 8  # fewer: no veto
_SPREAD_PERSIST = 32  # windows of recurring vetoes after which the spread is no burst


def alarm(det: BankCusum, cells: I64, t: F64, stat: F64) -> Detections:
    """What the alarms of `cells` (at times `t`, statistics `stat`) became: each gets
    an onset, the spread veto may drop it, and one whose effect is below
    `min_rel_change` re-baselines silently. Every alarm that stands re-baselines."""
    s, k = det._s, det.n_metrics
    vals, times = det._chrono(cells)
    mu = s["mu"][cells]
    bank = det._bank[:, cells]
    jr = s["jr"][cells]
    jumped = np.abs(jr) >= det.cfg.jump_windows
    up = np.where(jumped, jr > 0, bank[0::2].max(axis=0) >= bank[1::2].max(axis=0))
    d, first = _split_point(det, cells, vals, mu, up)
    fin = np.isfinite(vals)
    onset, early = _onset(det, cells, t, times, fin, first, bank, up, jumped)
    first_bad = times[np.arange(cells.size), first]
    post = fin & (np.arange(det.cfg.history) >= first[:, None])
    if det.cfg.spread_veto > 0:
        keep = _spread_veto(det, cells, stat, vals, post, mu, d, jumped)
        if not keep.all():
            cells, t, stat, mu = cells[keep], t[keep], stat[keep], mu[keep]
            vals, post, onset, first_bad = vals[keep], post[keep], onset[keep], first_bad[keep]
            fin, early = fin[keep], early[keep]
            if not cells.size:
                return Detections.empty()
    # A shift dated before the ring (the smallest member's run is longer than the ring)
    # has every sample of the ring after it: its size is their median, not that of the
    # split's suffix, which with heavy tails can be the last two dips of a small drift.
    post = np.where(early[:, None], fin, post)
    after = np.nanmedian(np.where(post, vals, np.nan), axis=1)
    before = mu
    big = np.abs(after - before) >= det.cfg.min_rel_change * np.maximum(
        np.abs(before), det.cfg.abs_floor
    )
    n_big = int(np.count_nonzero(big))
    det._stats["reported"] += n_big
    det._stats["below_min_change"] += int(big.size) - n_big
    _rebaseline(det, cells, vals, post)
    return Detections(
        rows=cells[big] // k,
        cols=cells[big] % k,
        detected_ts=t[big] + det._t0,
        onset_ts=onset[big] + det._t0,
        before=before[big],
        after=after[big],
        score=stat[big] / det.cfg.h,
        first_bad_ts=np.maximum(first_bad[big] + det._t0, onset[big] + det._t0),
    )


def _split_point(det: BankCusum, cells: I64, vals: F64, mu: F64, up: _Mask) -> tuple[F64, I64]:
    """The maximum-likelihood split of each alarming cell's ring against its known
    level: the suffix maximising (signed suffix sum)² / suffix length. Returns the
    signed, bounded deviations and the chronological index of the first post-change
    sample (the oldest valid one when no suffix leans the alarm's way, e.g. when
    whitening made the alarm)."""
    s = det._s
    fin = np.isfinite(vals)
    sign = np.where(up, 1.0, -1.0)
    d = np.where(fin, (vals - mu[:, None]) * sign[:, None], 0.0)
    # Deviations bounded, so that one outlier left in the ring cannot drag the split
    # towards itself: at `clip` marginal sigmas (with the front-end's looser bound, one
    # outlier on top of a slow drift can become the whole post-change segment, and
    # `after` its value), or 1.5x the newest samples' shift for a step larger than that
    # (a tighter bound would blur a big step's onset).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN tail: no estimate
        recent = np.nanmedian(vals[:, -4:], axis=1)
    step = np.nan_to_num(np.abs(recent - mu), nan=0.0)
    marg = np.sqrt(1.0 - s["phi"][cells].astype(np.float64) ** 2)
    bnd = det.cfg.clip * s["sig"][cells] / marg  # `clip` marginal sigmas of the level
    lim = np.maximum(bnd, 1.5 * step)[:, None]
    d = np.clip(d, -lim, lim)
    suf = np.cumsum(d[:, ::-1], axis=1)[:, ::-1]
    cnt = np.cumsum(fin[:, ::-1], axis=1)[:, ::-1]
    gain = np.where(fin & (suf > 0), suf * suf / np.maximum(cnt, 1), -1.0)
    oldest = np.argmax(fin, axis=1)
    first = np.where(gain.max(axis=1) > 0, gain.argmax(axis=1), oldest)
    return d, first


def _onset(
    det: BankCusum,
    cells: I64,
    t: F64,
    times: F64,
    fin: _Mask,
    first: I64,
    bank: F32,
    up: _Mask,
    jumped: _Mask,
) -> tuple[F64, _Mask]:
    """The onset: the end of the last window before the split (the first post-change
    sample's own time when the split is at the ring's oldest slot), and which onsets
    were dated before the ring."""
    rix = np.arange(cells.size)
    onset = times[rix, np.maximum(first - 1, 0)]
    onset = np.where((first > 0) & np.isfinite(onset), onset, times[rix, first])
    # A shift slow enough that only the smallest member fired may have begun before the
    # ring: then extrapolate that member's run back at the ring's median spacing.
    smallest = np.argmax(bank, axis=0) < 2
    run = np.where(up, det._run[0, cells], det._run[1, cells]).astype(np.float64)
    gaps = np.where(fin[:, 1:] & fin[:, :-1], np.diff(times, axis=1), np.nan)
    n_valid = fin.sum(axis=1)
    early = smallest & ~jumped & (run > n_valid) & (n_valid >= 2)
    if early.any():
        spacing = np.nanmedian(gaps[early], axis=1)
        onset[early] = np.where(np.isfinite(spacing), t[early] - run[early] * spacing, onset[early])
    return onset, early


def _spread_veto(
    det: BankCusum, cells: I64, stat: F64, vals: F64, post: _Mask, mu: F64, d: F64, jumped: _Mask
) -> _Mask:
    """Which alarms stand; a vetoed one's evidence is divided by the local spread ratio.

    A burst of spread is not a shift of level: an alarm whose recent windows spread
    much wider than the scale its evidence assumed is vetoed, and that evidence is
    rescaled to the local spread (the CUSUM goes on from there). Unless the shift
    stands at the local spread too: the post-change segment's GLR with the variance r2
    times larger reaches 2h (2h: the split picked the segment that maximises it); a
    step whose noise grew with the level is still a step, a burst's lean is not. And
    unless the vetoes have kept coming for longer than a burst lasts: a shift whose
    noise also grew (thermal throttling: lower and jumpier) would otherwise wait for
    the slow scale; an alarm whose level did not move then meets `min_rel_change`.
    """
    s = det._s
    r2 = _local_spread2(det, cells, vals, post, mu)
    n_post = post.sum(axis=1)
    lean = np.where(post, d, 0.0).sum(axis=1) / np.maximum(n_post, 1)
    lean *= (1.0 - s["phi"][cells]) / s["sig"][cells]
    glr = 0.5 * n_post * lean * lean / r2
    n_now = s["n"][cells].astype(np.int64)
    vfirst, vlast = s["vfirst"][cells], s["vlast"][cells]
    recurring = (vlast > 0) & (n_now - vlast <= _SPREAD_PERSIST)
    persists = recurring & (n_now - vfirst >= _SPREAD_PERSIST)
    keep: _Mask = (
        jumped | (r2 <= det.cfg.spread_veto**2 * stat / det.cfg.h) | (glr >= 2.0 * det.cfg.h)
    )
    keep |= persists
    if not keep.all():
        drop = cells[~keep]
        det._stats["vetoed"] += int(drop.size)
        s["vfirst"][drop] = np.where(recurring[~keep], vfirst[~keep], n_now[~keep])
        s["vlast"][drop] = n_now[~keep]
        det._bank[:, drop] /= r2[~keep].astype(np.float32)
    return keep


def _local_spread2(
    det: BankCusum, cells: I64, vals: F64, post: npt.NDArray[np.bool_], mu: F64
) -> F64:
    """Squared ratio of the ring's recent spread to the cell's scale (>= 1; 1 if unknown).

    The spread comes from successive differences, which a level step moves in one
    pair only (the pair across the onset is left out), over the last `_SPREAD_PAIRS`
    pairs: the clipped mean square of the differences, in innovation units (the
    difference of an AR(1) has variance 2 sigma^2 / (1 + phi)), over its Gaussian
    value.
    """
    s, c = det._s, det.cfg.clip
    dev = (vals - mu[:, None]) / s["sig"][cells][:, None]
    dd = np.diff(dev, axis=1)
    pre = np.isfinite(vals) & ~post
    ok = (post[:, 1:] & post[:, :-1]) | (pre[:, 1:] & pre[:, :-1])
    ok[:, :-_SPREAD_PAIRS] = False
    q = np.where(ok, dd * dd, 0.0)
    q *= (1.0 + s["phi"][cells].astype(np.float64))[:, None] * 0.5
    np.minimum(q, c * c, out=q)
    cnt = ok.sum(axis=1)
    r2 = q.sum(axis=1) / np.maximum(cnt, 1) / det._kappa
    return np.where(cnt >= _SPREAD_MIN_PAIRS, np.maximum(r2, 1.0), 1.0)


def _rebaseline(det: BankCusum, cells: I64, vals: F64, post: _Mask) -> None:
    """Restart alarming cells from their post-onset samples; the older ones go."""
    s, hist = det._s, det.cfg.history
    s["jr"][cells] = 0.0
    s["jm"][cells] = 0.0
    s["vfirst"][cells] = 0
    s["vlast"][cells] = 0
    det._bank[:, cells] = 0.0
    det._run[:, cells] = 0.0
    slots = (s["pos"][cells, None] + np.arange(hist)) % hist
    ring = det._ring[:, cells].T.copy()
    # The samples to come lie about the new level: anchor the ring there, or those that
    # arrive before the next baseline are held only to 2^-11 of the shift's size.
    kept_vals = np.where(post, vals, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row without post samples
        level = np.nanmedian(kept_vals, axis=1)
    anchor = np.where(np.isfinite(level), level, s["ra"][cells]).astype(np.float32)
    unit = bank_ring.unit_for_ring(kept_vals.T, anchor, s["sig"][cells])
    s["ra"][cells], s["rs"][cells] = anchor, unit
    kept = bank_ring.encode(kept_vals, anchor[:, None], unit[:, None])
    np.put_along_axis(ring, slots, kept, axis=1)
    det._ring[:, cells] = ring.T
    k_post = post.sum(axis=1).astype(np.int32)
    s["n"][cells] = k_post
    ready = k_post >= det.cfg.burn_in
    if ready.any():
        det._baseline(cells[ready])
