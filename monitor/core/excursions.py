"""Where each load-normalised stream went when its load left, to tell a return from a step.

A load model is an approximation: at a load far from its usual one (a burst) it can be
wrong, and a stream's ratio to it steps away there and back again as the load comes and
goes. The step back is the bad way when the step away was the good way (a stall share
the model over-predicts at the burst's load), and it can also land a little off the
ratio the stream had before, because the model learnt from the burst's samples too.
A step the bad way that takes a stream back to the level it left at its last step the
good way, nearer the model's expectation than it was, found at another load than that
step was, is that return, not a regression: the stream compares with its own history.
A burst's rise from a calm level the model fits moves the ratio away from 1 and is no
return, however like the last burst's it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from monitor.arrays import F64, I64


@dataclass(frozen=True, slots=True)
class Left:
    """The ratio a stream left at a step the good way, and the load it was found at."""

    level: float
    batch: float
    rate: float
    onset_ts: float


@dataclass
class Excursions:
    """Per (stream kind, row, metric column): the level left at the stream's first step
    the good way since its last step the bad way."""

    _left: dict[tuple[str, int, int], Left] = field(default_factory=dict)

    def returns(
        self, kind: str, det_rows: I64, cols: I64, before: F64, after: F64, sign: F64,
        load: F64, onset_ts: F64, floor_rel: F64, load_rel: float,
    ) -> F64:  # fmt: skip
        """For each detection, the onset of the excursion it returns from, NaN if none.

        `sign`: +1 where up is bad, -1 where down is bad, 0 for neither (never a return);
        `load`: (batch, request rate) at detection, per detection; `before`, `after` in
        the load-normalised units the levels are compared in.
        """
        out = np.full(det_rows.size, np.nan)
        triples = zip(det_rows.tolist(), cols.tolist(), sign.tolist(), strict=True)
        for i, (row, col, s) in enumerate(triples):
            if s == 0:
                continue
            key = (kind, int(row), int(col))
            move = (after[i] - before[i]) * s
            if move < 0:
                # The first step away is the level the stream left; a second step further
                # the same way is still the same excursion.
                batch, rate = (float(x) for x in load[i, :2])
                self._left.setdefault(key, Left(float(before[i]), batch, rate, float(onset_ts[i])))
                continue
            if not move > 0:
                continue
            left = self._left.pop(key, None)
            if left is None or not np.isfinite(left.level) or left.level == 0:
                continue
            # Back to its own level, and nearer the expectation (a ratio of 1) than it
            # was: the excursion was the departure from the model, and a return shrinks
            # it. A burst's rise from a calm level the model fits moves away from 1.
            back = abs(after[i] - left.level) < floor_rel[i] * abs(left.level)
            nearer = abs(after[i] - 1.0) < abs(before[i] - 1.0)
            if back and nearer and _moved((left.batch, left.rate), load[i, :2], load_rel):
                out[i] = left.onset_ts
        return out

    def forget(self, kind: str, rows: I64) -> None:
        """Drop released rows' entries (before the rows are reused)."""
        if not self._left or rows.size == 0:
            return
        gone = set(rows.tolist())
        self._left = {k: v for k, v in self._left.items() if k[0] != kind or k[1] not in gone}

    def snapshot(self) -> list[tuple[str, int, int, float, float, float, float]]:
        """The entries as plain tuples (the checkpoint format)."""
        return [(*k, v.level, v.batch, v.rate, v.onset_ts) for k, v in self._left.items()]

    @classmethod
    def restore(cls, rows: list[tuple[str, int, int, float, float, float, float]]) -> Excursions:
        """Entries back from `snapshot`."""
        return cls({(k, int(r), int(c)): Left(lv, b, rt, t) for k, r, c, lv, b, rt, t in rows})

    def __len__(self) -> int:
        return len(self._left)


def _moved(then: tuple[float, float], now: F64, rel: float) -> bool:
    """Whether batch or request rate differ by more than `rel` (either way) between two
    loads; an unknown (non-positive or NaN) load never counts as moved."""
    for a, b in zip(then, now.tolist(), strict=True):
        known = a > 0 and b > 0 and np.isfinite(a) and np.isfinite(b)
        if known and abs(np.log(b / a)) > np.log1p(rel):
            return True
    return False
