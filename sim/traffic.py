"""Request load per pool: diurnal cycle, burst episodes and step changes (traffic policy)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Burst:
    """A burst episode: load x `mult` on (start, end]."""

    start: float
    end: float
    mult: float


@dataclass(frozen=True, slots=True)
class TrafficSpec:
    """Load multiplier over time; the workload's tick and batch turn it into requests/s."""

    diurnal_amp: float = 0.0  # peak-to-mean share of the daily cycle
    peak_hour_utc: float = 15.0
    bursts: tuple[Burst, ...] = ()
    steps: tuple[tuple[float, float], ...] = ()  # (ts, multiplier from then on)
    base_load: float = 0.25  # share of max_batch a device's router fills at mean load
    # Capacity / mean offered load. When set, the router's tick is the engine's full-batch
    # step (the batch pins at max_batch exactly when load reaches capacity), base_load is
    # 1/headroom, and the admission wait grows like rho/(1-rho) with utilisation rho.
    headroom: float | None = None
    max_queue_s: float = 30.0  # admission sheds requests that would wait longer than this

    def load(self, ts: float) -> float:
        """Load multiplier (1.0 = mean load) at event time `ts`."""
        phase = 2.0 * math.pi * ((ts / 3600.0 - self.peak_hour_utc) / 24.0)
        m = 1.0 + self.diurnal_amp * math.cos(phase)
        for b in self.bursts:
            if b.start < ts <= b.end:
                m *= b.mult
        for at, mult in self.steps:
            if ts > at:
                m *= mult
        return m

    def in_burst(self, ts: float) -> bool:
        """Whether a burst episode covers event time `ts`."""
        return any(b.start < ts <= b.end for b in self.bursts)


def random_bursts(
    rng: np.random.Generator,
    start: float,
    end: float,
    per_hour: float,
    window_s: float,
    *,
    avoid: tuple[tuple[float, float], ...] = (),
    mult: tuple[float, float] = (1.6, 2.4),
    minutes: tuple[float, float] = (2.0, 6.0),
) -> tuple[Burst, ...]:
    """Burst episodes at a Poisson rate, window-aligned, kept clear of the `avoid` spans."""
    n = int(rng.poisson(per_hour * (end - start) / 3600.0))
    out: list[Burst] = []
    for _ in range(max(n, 0)):
        dur = float(rng.uniform(*minutes)) * 60.0
        s = float(rng.uniform(start, max(start, end - dur)))
        s = start + round((s - start) / window_s) * window_s
        e = s + round(dur / window_s) * window_s
        clash = any(s < a_end and e > a_start for a_start, a_end in avoid)
        overlap = any(s < b.end + 2 * window_s and e > b.start - 2 * window_s for b in out)
        if not clash and not overlap:
            out.append(Burst(s, e, float(rng.uniform(*mult))))
    return tuple(sorted(out, key=lambda b: b.start))
