"""Warm starts: a stream that finishes burn-in borrows the AR and long-run variance
estimates of a mature stream of its family (`BankParams.warm_start` > 0, families
given with each wave), credited as `warm_start` samples.

Only a stream whose own burn-in agrees with its family borrows. While its credit
outweighs its own samples, each fresh ring is reviewed, and a borrower that proves
more persistent than the estimates it borrowed drops them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from monitor.arrays import F64, I64
from monitor.detect import bank_state

if TYPE_CHECKING:
    from monitor.detect.bank import BankCusum

# How streams that finished burn-in with families given started: from a family member's
# estimates, on their own because they disagreed with the family, or on their own for
# want of mature family members. `withdrawn`: a borrower whose own samples later showed
# it more persistent than the estimates it borrowed (it then goes on from its own).
WARM_OUTCOMES = ("borrowed", "own", "no_donor", "withdrawn")
# A new stream's AR estimates come from the phi at this quantile of at least this many
# mature streams of its family and column.
_WARM_QUANTILE = 0.75
_WARM_MIN_DONORS = 4
# ... unless the cell's own burn-in estimate lies more than this many standard errors
# above the family's (it would be under-whitened: pages) or below it (over-whitened: slow).
_WARM_ABOVE = 0.5
_WARM_BELOW = 2.0
FAM_MAX = (1 << 31) - 1  # families are stored as id + 1 in int32
# While a cell's own samples are fewer than its credit, each fresh ring (every `history`
# samples) is checked: a lag-1 autocorrelation this many standard errors above the phi
# in use means the borrowed estimates under-whiten it, and they are dropped.
_WARM_WITHDRAW = 3.0
_REVIEW_MIN = 8  # fewer samples in the ring: no review
_EPS32 = np.float32(1e-12)
# Estimates a borrower takes over (in innovation sigmas, so they carry over between
# streams of different scales).
_BORROWED = ("phi", "c0", "c1", "c2", "lv", "theta")


def unbiased_lag1(est: F64, count: F64) -> F64:
    """A lag-1 autocorrelation from `count` samples, less its small-sample bias."""
    return est + (1.0 + 3.0 * est) / count


class WarmStarts:
    """A bank's warm-start bookkeeping: this wave's families, the cells on borrowed
    estimates, and the outcome counts since the last `drain`."""

    def __init__(self) -> None:
        self.families: tuple[I64, I64] | None = None  # this wave's (rows, groups), if given
        self.credit = np.empty(0, dtype=np.int64)  # cells on borrowed AR estimates
        self.counts = dict.fromkeys(WARM_OUTCOMES, 0)

    def drain(self) -> dict[str, int]:
        """Streams started since the last call, by `WARM_OUTCOMES`; the counts restart."""
        out, self.counts = self.counts, dict.fromkeys(WARM_OUTCOMES, 0)
        return out

    @staticmethod
    def checked(rows: I64, groups: I64) -> tuple[I64, I64]:
        """A wave's (rows, families), ValueError unless one family id per row."""
        fam = np.asarray(groups, dtype=np.int64)
        if fam.shape != rows.shape or int(fam.min()) < 0 or int(fam.max()) >= FAM_MAX:
            raise ValueError(f"groups must be one id in [0, {FAM_MAX}) per row")
        return rows, fam

    def donors(self, det: BankCusum, cells: I64, est: F64, count: F64) -> I64:
        """For each never-baselined cell, a mature cell of its family and column whose phi
        is at the family's upper quartile (-1: none, fewer than `_WARM_MIN_DONORS`, or a
        cell whose own burn-in disagrees with its family).

        The upper quartile errs towards over-whitening, which costs a little power, not
        false pages. `est` is the cell's own (bias-corrected) lag-1 autocorrelation from
        `count` burn-in samples: a cell clearly more persistent than its family would be
        under-whitened and page, one clearly less persistent would be over-whitened and
        slow, so either keeps its own estimates. Families come with the wave (`update`'s
        `groups`); the wave's rows are (re)labelled here, so only waves in which some
        cell finishes burn-in pay.
        """
        out = np.full(cells.size, -1, dtype=np.int64)
        if self.families is None:
            return out
        s, k = det._s, det.n_metrics
        rows_in, fam_in = self.families
        wave_cells = (rows_in[:, None] * k + np.arange(k)).ravel()
        s["fam"][wave_cells] = np.repeat(fam_in + 1, k).astype(np.int32)
        credit = min(det.cfg.warm_start, det._ns_max)
        used = bank_state.rows_in_use(det) * k
        fam = s["fam"][:used]
        # Only the families of the cells starting now (a table lookup, no sort of the
        # whole detector); own samples (the scale's count), not credited ones: a
        # warm-started cell lends nothing until its estimates rest on its own data.
        wanted = np.unique(s["fam"][cells])  # labelled just above: ids + 1, never 0
        mature = np.flatnonzero(np.isin(fam, wanted) & (s["ns"][:used] >= credit))
        if mature.size < _WARM_MIN_DONORS:
            self.counts["no_donor"] += cells.size
            return out
        # Donor candidates sorted by (family, column, phi): each (family, column) is one
        # run, and its upper quartile sits at a fixed share of the run.
        key = fam[mature].astype(np.int64) * k + mature % k
        order = np.lexsort((s["phi"][mature], key))
        mature, key = mature[order], key[order]
        want = s["fam"][cells].astype(np.int64) * k + cells % k
        lo = np.searchsorted(key, want, side="left")
        hi = np.searchsorted(key, want, side="right")
        size = hi - lo
        ok = size >= _WARM_MIN_DONORS
        pick = lo + np.floor(_WARM_QUANTILE * (size - 1)).astype(np.int64)
        got = mature[np.minimum(pick, mature.size - 1)]
        ref = s["c1"][got] / np.maximum(s["c0"][got], _EPS32)  # the donor's own estimate
        se = 1.0 / np.sqrt(np.maximum(count, 1.0))
        with_donors = int(ok.sum())
        ok &= (est <= ref + _WARM_ABOVE * se) & (est >= ref - _WARM_BELOW * se)
        out[ok] = got[ok]
        borrowed = int(ok.sum())
        self.counts["borrowed"] += borrowed
        self.counts["own"] += with_donors - borrowed
        self.counts["no_donor"] += cells.size - with_donors
        return out

    def borrow(self, det: BankCusum, to: I64, src: I64) -> None:
        """Cells `to` take over the estimates of donors `src`, credited as `warm_start`
        samples: they whiten like mature cells from their first active window, and their
        own samples take over at the AR window's pace."""
        s = det._s
        if not det._split:
            s["na"][...] = s["ns"]  # from here on the two counts are kept apart
            det._split = True
        self.credit = np.union1d(self.credit, to)
        for name in _BORROWED:
            s[name][to] = s[name][src]
        s["na"][to] = np.maximum(s["na"][to], min(det.cfg.warm_start, det._ns_max))

    def review(self, det: BankCusum) -> None:
        """Drop borrowed AR estimates from cells whose own fresh ring says they under-whiten.

        A joiner that looked like its family in its burn-in may still be more persistent
        (an AR(1) stream in a white family): whitened with the family's phi it pages until
        its own samples outweigh the credit. So each time its ring has filled with new
        samples, its lag-1 autocorrelation there is set against the phi in use; well above
        it, the cell starts over from the ring's own estimates (their wide margin, its
        long-run variance afresh, its bank at zero).
        """
        s, credit = det._s, min(det.cfg.warm_start, det._ns_max)
        c = self.credit
        c = c[(s["na"][c] > s["ns"][c]) & (s["ns"][c] < credit)]  # forgotten, or own by now
        self.credit = c
        age = s["n"][c].astype(np.int64) - det.cfg.burn_in
        due = c[(age > 0) & (age % det.cfg.history == 0)]
        if due.size == 0:
            return
        vals = det._chrono_values(due)
        fin = np.isfinite(vals)
        # Around the ring's own median, as at burn-in: a shift building up in the ring would
        # read as persistence around the old level.
        seen = np.asarray(fin.any(axis=1))
        mid = np.nanmedian(np.where(seen[:, None], vals, 0.0), axis=1)
        d = np.clip((vals - mid[:, None]) / s["sig"][due, None], -det._dclip, det._dclip)
        d = np.where(fin, d, 0.0)
        cnt = fin.sum(axis=1).astype(np.float64)
        lag0 = (d * d).sum(axis=1)
        lag1 = (d[:, 1:] * d[:, :-1]).sum(axis=1)
        lag2 = (d[:, 2:] * d[:, :-2]).sum(axis=1)
        est = np.clip(lag1 / np.maximum(lag0, 1e-12), -1.0, 1.0)
        n = np.maximum(cnt, 1.0)
        est_bc = unbiased_lag1(est, n)
        bad = (cnt >= _REVIEW_MIN) & (est_bc > s["phi"][due] + _WARM_WITHDRAW / np.sqrt(n))
        if not bad.any():
            return
        cells, n_b = due[bad], n[bad]
        s["c0"][cells] = lag0[bad] / n_b
        s["c1"][cells] = lag1[bad] / n_b
        s["c2"][cells] = lag2[bad] / n_b
        s["phi"][cells] = det._phi_bound(est_bc[bad], n_b)
        s["na"][cells] = n_b.astype(np.int32)
        if det.cfg.ma_max > 0:  # else unread (`bank_state.idle`)
            s["theta"][cells] = 0.0
        s["lm"][cells] = 0.0
        s["lv"][cells] = 1.0 / det._lrv_unit if det.cfg.lrv_window > 0 else 0.0
        det._bank[:, cells] = 0.0  # evidence gathered under the wrong whitening
        det._run[:, cells] = 0.0
        self.credit = np.setdiff1d(self.credit, cells)
        self.counts["withdrawn"] += int(cells.size)
