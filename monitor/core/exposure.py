"""What load each pool ran at, lately: whether a change was already put to the test.

A change is a cause only if the regression showed once the change met the load it
shows at. A pool that served, after the change and before the onset, at least the
onset's offered load for `LEAD_WINDOWS` windows without regressing has put the change
to that test and passed: a driver updated three hours before a NIC failed is not what
failed. A regression that shows only under burst load is still blamed on the change
before it when no burst came between the two (the calm windows are no test).

Per pool: one bin a minute of the pool's recent windows, each with the most offered
load (request rate) seen in it and how many windows it held, for the advisor's
look-back. Training pools report no request rate; every window of theirs is a test.
Not checkpointed: after a restart nothing counts as tested until the pool has run
again, so the advisor falls back to the plain look-back.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from monitor.indicators import DEFAULT_MIN_REL_CHANGE, MIN_REL_CHANGE

BIN_S = 60.0
# Loads within the request rate's reporting floor of each other are the same load: a pool
# whose rate drifts up a fraction of a percent an hour still ran at its onset's load.
SAME_LOAD = MIN_REL_CHANGE.get("req_rate", DEFAULT_MIN_REL_CHANGE)


@dataclass
class PoolExposure:
    """Per pool, per minute: (highest request rate, windows seen); pruned by age."""

    span_s: float = 6 * 3600.0
    _bins: dict[str | None, dict[int, list[float]]] = field(default_factory=dict)

    def observe(self, pool: str | None, ts: float, load: float) -> None:
        """One window of a pool at event time `ts`, with its request rate (NaN: none)."""
        b = self._bins.setdefault(pool, {}).setdefault(int(ts // BIN_S), [-math.inf, 0.0])
        b[0] = max(b[0], load)  # a NaN load never wins: b[0] stays a number
        b[1] += 1.0

    def prune(self, now_ts: float) -> None:
        """Forget bins older than the span; pools left with none go too."""
        cut = int((now_ts - self.span_s) // BIN_S)
        for pool in list(self._bins):
            bins = self._bins[pool]
            # Minutes arrive in order (late records aside): the old ones are at the front.
            old = []
            for k in bins:
                if k >= cut:
                    break
                old.append(k)
            for k in old:
                del bins[k]
            if not bins:
                del self._bins[pool]

    def novelty(self, pool: str | None, onset_ts: float, detected_ts: float,
                before_ts: float) -> float:  # fmt: skip
        """The peak request rate from the onset's minute to the detection's over the highest
        the pool ran at in whole minutes before `before_ts`: above 1, a load it never ran
        at in its look-back. 1.0 when unknown (no request rate, or nothing before)."""
        bins = self._bins.get(pool)
        if not bins:
            return 1.0
        at = [bins[k][0] for k in range(int(onset_ts // BIN_S), int(detected_ts // BIN_S) + 1)
              if k in bins]  # fmt: skip
        cut = int(before_ts // BIN_S)
        earlier = [b[0] for k, b in bins.items() if k < cut]
        if not at or not earlier:
            return 1.0
        peak, prior = max(at), max(earlier)
        if not (math.isfinite(peak) and math.isfinite(prior)) or prior <= 0:
            return 1.0
        return peak / prior

    def served_ratio(
        self, pool: str | None, onset_ts: float, detected_ts: float, span_s: float
    ) -> float:
        """The pool's median minute (its peak request rate per device) from the onset's
        minute to the detection's over its median minute in `span_s` before the onset:
        how much more work its devices served as the change began. 1.0 when unknown."""
        bins = self._bins.get(pool)
        if not bins:
            return 1.0
        first = int(onset_ts // BIN_S)
        after = [bins[k][0] for k in range(first, int(detected_ts // BIN_S) + 1) if k in bins]
        before = [bins[k][0] for k in range(int((onset_ts - span_s) // BIN_S), first) if k in bins]
        if not after or not before:
            return 1.0
        now, then = statistics.median(after), statistics.median(before)
        if not (math.isfinite(now) and math.isfinite(then)) or then <= 0:
            return 1.0
        return now / then

    def tested(self, pool: str | None, since_ts: float, onset_ts: float, detected_ts: float,
               window_s: float, windows: int) -> bool:  # fmt: skip
        """Whether the pool ran at least `windows` windows at the onset's load (within
        `SAME_LOAD`) after `since_ts` and clearly before `onset_ts` (the onset estimate's
        own uncertainty, two windows, left out). False when unknown: nothing observed, or
        after a restart."""
        bins = self._bins.get(pool)
        if not bins:
            return False
        # Whole bins only: a bin straddling the change or the onset is not clean.
        lo = int(since_ts // BIN_S) + 1
        hi = int((onset_ts - 2.0 * window_s) // BIN_S) - 1
        if hi < lo:
            return False
        at_onset = [bins[k][0] for k in range(int(onset_ts // BIN_S), int(detected_ts // BIN_S) + 1)
                    if k in bins]  # fmt: skip
        if not at_onset:
            return False
        # The onset minute's peak request rate; -inf where the pool reports none (a training
        # pool), and then every window is a test. Minutes are compared peak to peak, and a
        # minute within `SAME_LOAD` below it ran at that load.
        need = max(at_onset) / (1.0 + SAME_LOAD)
        count = 0.0
        for k in range(lo, hi + 1):
            b = bins.get(k)
            if b is not None and b[0] >= need:
                count += b[1]
                if count >= windows:
                    return True
        return False
