"""`flopwatch detect --finite`: change points of a series whose length is known.

Still online: sample ``t`` is judged on samples ``0..t`` alone, in one pass, and a
change point once reported is never withdrawn. Only the sizes follow from the
length ``n`` (the daemon's engine, built for endless streams, is not involved):

- **Burn-in.** A segment (the series start, or the latest onset) is tested only
  once it holds ``burn_in(n) = max(8, ceil(n / 10))`` samples before the split: 8
  so that the scale rests on at least 7 differences, a tenth of the series so
  that long series learn their noise as well as the daemon's 32-sample burn-in
  would, while a 50-point history still has 42 samples to be judged.
- **Threshold.** At most one false alarm per series in expectation: each
  (split, sample) pair is a test, there are fewer than ``n²/2`` of them, so a
  two-sided normal bound of ``1 / n²`` per test keeps the expected number of
  exceedances, and with it of false alarms, at most 1 (Bonferroni; the tests are
  strongly correlated, so the real rate is well below).
- **Noise.** Estimated on the segment itself, robustly: the mean absolute
  deviation of first differences about their median (a level shift is one
  difference among many; a steady trend moves only the median; unlike their
  median absolute deviation it does not collapse to 0 on sticky, quantised
  series), and an AR(1) coefficient from the ratio of lag-2 to lag-1 differences
  (``Var(x_t − x_{t−2}) / Var(x_t − x_{t−1}) = 1 + φ``), so that the test uses the
  long-run variance ``σ²(1+φ)/(1−φ)`` of a mean of autocorrelated samples.
- **Model check.** The test's model, noise stationary about a line, makes the
  first differences stationary too. A segment whose differences themselves wander
  (the variance of their lag-2 differences at least twice that of their lag-1
  ones: ``1 + φ ≥ 2`` for the slope, a unit root) is a twice-integrated curve:
  against a line its curvature reads as one step after another, so such a segment
  is not tested. A level shift does not trip the check: it is one spike among the
  differences, which pulls the ratio towards 1, not 2.
- **Test.** The segment's level may drift linearly; the statistic is the
  standardised step at the best split against a common line (a trend alone does
  not alarm). Deviations from that line are clipped at the daemon's ``clip``
  (2.5 sd) first, so heavy-tailed outliers cannot make a step, and the split
  leaves at least 3 samples after it (the daemon's ``jump_windows``): one or two
  outliers never alarm alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from monitor.arrays import F64
from monitor.detect.bank_params import BankParams

BURN_IN_FLOOR = 8
BURN_IN_FRACTION = 0.1
FALSE_ALARMS_PER_SERIES = 1.0
MIN_AFTER = BankParams().jump_windows
CLIP = BankParams().clip
# The AR coefficient's cap: a memory 1/(1-φ) of at most 10 samples, about the burn-in
# floor; a stronger one cannot be told from drift within a short segment, and the
# long-run variance it implies would silence the test (the daemon's ar_max, 0.98, was
# the other candidate; see docs/benchmarks.md).
PHI_MAX = 0.9
_MEAN_ABS_TO_SD = math.sqrt(math.pi / 2.0)  # E|Z| = sqrt(2/pi) for a standard normal Z


def burn_in(n: int) -> int:
    """Samples a segment holds before its first test, for a series of `n`."""
    return max(BURN_IN_FLOOR, math.ceil(BURN_IN_FRACTION * n))


def threshold(n: int) -> float:
    """The |z| bound that keeps the expected false alarms of `n` samples at most one."""
    tests = max(n * n / 2.0, 1.0)
    return NormalDist().inv_cdf(1.0 - FALSE_ALARMS_PER_SERIES / (2.0 * tests))


def _spreads(y: F64) -> tuple[float, float]:
    """Robust sds of `y`'s lag-1 and lag-2 differences (about their medians)."""
    d1 = np.diff(y)
    d2 = y[2:] - y[:-2]
    s1 = float(np.mean(np.abs(d1 - np.median(d1)))) * _MEAN_ABS_TO_SD
    s2 = float(np.mean(np.abs(d2 - np.median(d2)))) * _MEAN_ABS_TO_SD
    return s1, s2


def integrated_twice(y: F64) -> bool:
    """Whether `y`'s first differences have a unit root (lag-2 variance ≥ 2× lag-1)."""
    if y.size < 5:
        return False
    s1, s2 = _spreads(np.diff(y))
    return s1 > 0.0 and s2 * s2 >= 2.0 * s1 * s1


def noise(y: F64) -> tuple[float, float]:
    """Marginal variance and long-run variance factor of a segment's noise (0, 1 if flat)."""
    s1, s2 = _spreads(y)
    if not s1 > 0.0:
        return 0.0, 1.0
    phi = min(max((s2 / s1) ** 2 - 1.0, 0.0), PHI_MAX)
    # Var(d1) = 2 σ² (1 − φ) for AR(1) noise of marginal variance σ².
    return s1 * s1 / (2.0 * (1.0 - phi)), (1.0 + phi) / (1.0 - phi)


@dataclass(frozen=True, slots=True)
class Split:
    """The best split of a segment: its position, the levels either side and |z|."""

    at: int  # first sample after the split, within the segment
    before: float
    after: float
    z: float


def best_split(y: F64, first: int, min_after: int = MIN_AFTER) -> Split | None:
    """The split of `y` (at `first` or later, `min_after` samples after it) with the
    largest standardised step against a common line; None if the noise is flat or
    the segment is a twice-integrated curve (the test's model does not hold)."""
    var, lrv = noise(y)
    if var <= 0.0 or integrated_twice(y):
        return None
    size = y.size
    t = np.arange(size, dtype=np.float64)
    q1 = np.full(size, 1.0 / math.sqrt(size))
    tc = t - t.mean()
    q2 = tc / np.linalg.norm(tc)
    line = q1 * (q1 @ y) + q2 * (q2 @ y)
    lim = CLIP * math.sqrt(var)
    r = np.clip(y - line, -lim, lim)
    r -= q1 * (q1 @ r) + q2 * (q2 @ r)  # residuals of the clipped series off its line
    tau = np.arange(first, size - min_after + 1)

    def tail(v: F64) -> F64:
        return np.cumsum(v[::-1])[::-1][tau]

    q1t, q2t = tail(q1), tail(q2)
    # |step ⊥ line|²: the step's information once the line is fitted alongside it.
    norm = np.maximum((size - tau) - q1t * q1t - q2t * q2t, 1e-12)
    z = np.abs(tail(r)) / np.sqrt(var * lrv * norm)
    j = int(np.argmax(z))
    at = int(tau[j])
    return Split(at, float(np.mean(y[:at])), float(np.mean(y[at:])), float(z[j]))


class FiniteSeries:
    """Feeds a series of known length sample by sample; yields change points as found."""

    def __init__(self, n: int) -> None:
        self.n = int(n)
        self.burn_in = burn_in(self.n)
        self.threshold = threshold(self.n)
        self.i = 0
        self._seg: list[float] = []  # present samples since the latest onset
        self._idx: list[int] = []  # their sample indices

    def push(self, value: float | None) -> list[tuple[int, int, float, float, float]]:
        """Feed sample `self.i`: (onset, detected, before, after, score) of a change it
        completes (at most one)."""
        i = self.i
        self.i += 1
        if value is None or math.isnan(value):
            return []
        self._seg.append(float(value))
        self._idx.append(i)
        if len(self._seg) < self.burn_in + MIN_AFTER:
            return []
        split = best_split(np.asarray(self._seg), self.burn_in)
        if split is None or split.z <= self.threshold:
            return []
        onset = self._idx[split.at]
        # Re-baseline on the samples since the onset, as the daemon's engine does.
        del self._seg[: split.at], self._idx[: split.at]
        return [(onset, i, split.before, split.after, split.z / self.threshold)]
