"""A plain, one-cell, sample-at-a-time float64 rendering of the bank engine's documented rules.

It shares no code with `monitor.detect.bank`: the vectorised engine must agree
with it (same detection times, same onsets, close levels) on clear-cut input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from monitor.detect.bank import clipped_second_moment


@dataclass
class RefHit:
    """One detection of the reference."""

    detected_ts: float
    onset_ts: float
    before: float
    after: float


@dataclass
class BankReference:
    """One cell of the bank engine, written for clarity rather than speed."""

    h: float = 11.0
    shifts: tuple[float, ...] = (0.5, 1.0, 2.0)
    clip: float = 2.5
    step_cap: float = 2.5
    burn_in: int = 32
    history: int = 32
    youth: float = 16.0
    maturity: float = 64.0
    baseline_window: int = 512
    scale_window: int = 1024
    ar_window: int = 4096
    ar_max: float = 0.98  # the engine default
    ar_margin: float = 1.0
    rel_floor: float = 1e-3
    abs_floor: float = 1e-9
    min_rel_change: float = 0.03
    jump: float = 6.0
    jump_windows: int = 3
    spread_veto: float = math.sqrt(2.0)
    ar2_margin: float = 1.5
    lrv_window: int = 32
    lrv_margin: float = 2.0
    ma_max: float = 0.0  # the engine default: no MA term
    jr: int = 0  # signed run of windows beyond `jump` marginal sigmas
    vfirst: int = 0  # n at the first spread veto of the current run of vetoes
    vlast: int = 0  # n at the latest spread veto
    ring: list[tuple[float, float]] = field(default_factory=list)  # (t, x); x NaN = dropped
    n: int = 0
    nb: int = 0
    ns: int = 0
    mu: float = 0.0
    sig: float = 1.0
    phi: float = 0.0
    c0: float = 0.0
    c1: float = 0.0
    c2: float = 0.0
    dprev: float = 0.0
    lprev: float = 0.0
    lprev2: float = 0.0
    lm: float = 0.0  # EW mean of the lagged, clipped innovations
    lv: float = 0.0  # EW mean square of lm
    theta: float = 0.0  # MA(1) coefficient, > 0 only where phi comes from c2/c1
    uprev: float = 0.0  # previous ARMA innovation
    ulprev: float = 0.0  # previous lagged ARMA innovation
    up: list[float] = field(default_factory=list)
    dn: list[float] = field(default_factory=list)
    run: list[float] = field(default_factory=lambda: [0.0, 0.0])

    def __post_init__(self) -> None:
        self.up = [0.0] * len(self.shifts)
        self.dn = [0.0] * len(self.shifts)
        self.kappa = clipped_second_moment(self.clip)
        self.dclip = self.clip * (1 + self.ar_max)
        self.youth_until = math.ceil(32 * self.youth)

    def _clip(self, v: float, b: float) -> float:
        return min(max(v, -b), b)

    def _phi_bound(self, est: float, count: float) -> float:
        count = max(count, 1.0)
        return est + (1 + 3 * est) / count + self.ar_margin / math.sqrt(count)

    def _phi_used(self, est: float, count: float) -> float:
        return min(max(self._phi_bound(est, count), 0.0), self.ar_max)

    def _theta(self) -> float:
        """theta / (1 + theta²) = -rho1(w), w = d - phi d_prev, from c0, c1, c2."""
        p = self.phi
        gw0 = self.c0 * (1 + p * p) - 2 * p * self.c1
        gw1 = self.c1 * (1 + p * p) - p * (self.c0 + self.c2)
        r = min(max(-gw1 / max(gw0, 1e-12), 1e-6), self.ma_max / (1 + self.ma_max**2))
        return (1 - math.sqrt(1 - 4 * r * r)) / (2 * r)

    def update(self, t: float, x: float) -> RefHit | None:
        """Feed one sample; a detection when one completes (NaN: ignored)."""
        if not math.isfinite(x):
            return None
        leaving = self.ring.pop(0)[1] if len(self.ring) == self.history else math.nan
        self.ring.append((t, x))
        self.n += 1
        if self.n <= self.burn_in:
            if self.n == self.burn_in:
                self._baseline()
            elif self.ns >= 128 and self.jump > 0:
                return self._relearning(t, x)
            return None
        return self._active(t, x, leaving)

    def _relearning(self, t: float, x: float) -> RefHit | None:
        """Re-learning its level after an alarm: the jump rule against the median of the
        samples since and the level before, with the scale it keeps."""
        level = float(np.median([v for _, v in self.ring if math.isfinite(v)]))
        marg = 1 / math.sqrt(max(self.c0, 1e-12)) if self.theta > 0 else math.sqrt(1 - self.phi**2)
        marginal = (x - level) / self.sig * marg
        was = (x - self.mu) / self.sig * marg  # and beyond the level before the alarm
        if marginal > self.jump and was > self.jump:
            self.jr = max(self.jr, 0) + 1
        elif marginal < -self.jump and was < -self.jump:
            self.jr = min(self.jr, 0) - 1
        else:
            self.jr = 0
        if abs(self.jr) < self.jump_windows:
            return None
        self.mu = level
        return self._alarm(t)

    def _active(self, t: float, x: float, xl: float) -> RefHit | None:
        c = self.clip
        raw = (x - self.mu) / self.sig
        # The level's own sigmas: sqrt(c0) innovation sigmas in an ARMA(1,1) cell.
        marg = 1 / math.sqrt(max(self.c0, 1e-12)) if self.theta > 0 else math.sqrt(1 - self.phi**2)
        marginal = raw * marg
        if self.ns < 128:  # the scale is not trusted for the jump rule yet
            self.jr = 0
        elif self.jump > 0 and marginal > self.jump:
            self.jr = max(self.jr, 0) + 1
        elif self.jump > 0 and marginal < -self.jump:
            self.jr = min(self.jr, 0) - 1
        else:
            self.jr = 0
        dz = self._clip(raw, 1e6)
        # Beyond dclip, d and d_prev are scaled down together (a shock's decay whitens to 0).
        w = (dz - self.phi * self.dprev) * self.dclip / max(abs(dz), abs(self.dprev), self.dclip)
        if self.ma_max > 0:  # ARMA(1,1) innovation u = w + theta u_prev (u = w at theta 0)
            u = self._clip(w + self.theta * self.uprev, self.dclip)
            self.uprev = u
            w = u * math.sqrt(1 + self.theta * self.theta)
        z = self._clip(w, c)
        self.dprev = dz
        if self.n < self.youth_until:
            z *= min(max(1 - self.youth / self.n, 0.0), 1.0)
        if self.lrv_window > 0:  # long-run variance ratio beyond its noise
            unit = (2 * self.lrv_window - 1) / self.kappa
            count = max(min(self.ns, self.ar_window), 1)
            pad = self.lrv_margin * math.sqrt(2 * self.lrv_window / count)
            ratio = self.lv * unit - (pad if self.theta <= 0 else 0.0)  # ARMA: point estimate
            z /= math.sqrt(max(ratio, 1.0))
        fire = abs(self.jr) >= self.jump_windows
        for j, d in enumerate(self.shifts):
            a_up, a_dn = d * z - d * d / 2, -d * z - d * d / 2
            if d * c - d * d / 2 > self.step_cap:
                a_up, a_dn = min(a_up, self.step_cap), min(a_dn, self.step_cap)
            self.up[j] = max(0.0, self.up[j] + a_up)
            self.dn[j] = max(0.0, self.dn[j] + a_dn)
            if self.nb < math.ceil(self.maturity / d**2):
                self.up[j] = self.dn[j] = 0.0
            if j == 0:
                self.run = [
                    (self.run[0] + 1) * (self.up[0] > 0),
                    (self.run[1] + 1) * (self.dn[0] > 0),
                ]
            fire = fire or max(self.up[j], self.dn[j]) > self.h
        if math.isfinite(xl):
            rl = self._clip((xl - self.mu) / self.sig, self.dclip)
            rl = self._clip(rl, c / marg)  # clip marginal sigmas
            self.nb = min(self.nb + 1, self.baseline_window)
            self.ns = min(self.ns + 1, max(self.scale_window, self.ar_window))
            self.mu += self.sig * rl / self.nb
            innovation = rl - self.phi * self.lprev
            el = min(innovation**2, c * c)
            a_s = 1 / min(self.ns, self.scale_window)
            self.sig *= 1 + a_s * (0.5 * el / self.kappa - 0.5)
            self.sig = max(self.sig, self.rel_floor * abs(self.mu), self.abs_floor)
            a_p = 1 / min(self.ns, self.ar_window)
            self.c0 += a_p * (rl * rl - self.c0)
            self.c1 += a_p * (rl * self.lprev - self.c1)
            self.c2 += a_p * (rl * self.lprev2 - self.c2)
            if self.lrv_window > 0:
                lag = innovation
                if self.ma_max > 0:
                    ul = self._clip(innovation + self.theta * self.ulprev, self.dclip)
                    self.ulprev = ul
                    lag = ul * math.sqrt(1 + self.theta * self.theta)
                # Learns while no shift builds up; ARMA cells always.
                if max(self.run) <= 64 or self.theta > 0:
                    self.lm += (self._clip(lag, c) - self.lm) / self.lrv_window
                    self.lv += a_p * (self.lm * self.lm - self.lv)
            r1 = self.c1 / (self.c0 + 1e-12)
            count = min(self.ns, self.ar_window)
            bound = self._phi_bound(r1, count)
            phi = min(max(bound, 0.0), self.ar_max)
            arma = False
            if self.ar2_margin > 0:  # ARMA(1,1): phi = c2/c1, its lower confidence bound
                ratio = min(self.c2 / max(self.c1, 1e-12), 1.0)
                lcb = ratio - self.ar2_margin / (max(r1, 1e-3) * math.sqrt(count))
                arma = self.ma_max > 0 and lcb > bound
                # Clearly ARMA: c2/c1 itself, and the MA term undoes what it over-whitens.
                phi = min(max(bound, ratio if arma else lcb, 0.0), self.ar_max)
            self.phi = phi
            self.theta = self._theta() if arma else 0.0
            self.lprev2 = self.lprev
            self.lprev = rl
        return self._alarm(t) if fire else None

    def _alarm(self, t: float) -> RefHit | None:
        rows = [v for pair in zip(self.up, self.dn, strict=True) for v in pair]
        member = rows.index(max(rows)) // 2  # the bank row that leads, first on ties
        jumped = abs(self.jr) >= self.jump_windows
        leads_up = self.jr > 0 if jumped else max(self.up) >= max(self.dn)
        sign = 1 if leads_up else -1
        times = [p[0] for p in self.ring]
        vals = [p[1] for p in self.ring]
        valid = [i for i, v in enumerate(vals) if math.isfinite(v)]
        best, first = -1.0, valid[0]
        tail = [v for v in vals[-4:] if math.isfinite(v)]
        step = abs(float(np.median(tail)) - self.mu) if tail else 0.0
        bound = self.clip * self.sig / math.sqrt(1 - self.phi * self.phi)  # marginal sigmas
        lim = max(bound, 1.5 * step)  # bounded deviations
        for i in valid:  # the earliest maximiser of (signed suffix sum)² / length
            suf = [self._clip(sign * (vals[k] - self.mu), lim) for k in valid if k >= i]
            s = sum(suf)
            g = s * s / len(suf) if s > 0 else -1.0
            if g > best:
                best, first = g, i
        onset = times[first - 1] if first > 0 else times[first]
        run = self.run[0] if sign > 0 else self.run[1]
        early = member == 0 and not jumped and run > len(valid) and len(valid) >= 2
        if early:
            spacing = float(np.median(np.diff([times[i] for i in valid])))
            onset = t - run * spacing
        if self.spread_veto > 0 and not jumped:
            # Successive differences within one side of the split, the last 16 ring pairs.
            pairs = [
                (vals[i + 1] - vals[i]) / self.sig
                for i in range(max(len(vals) - 17, 0), len(vals) - 1)
                if math.isfinite(vals[i])
                and math.isfinite(vals[i + 1])
                and (i >= first) == (i + 1 >= first)
            ]
            if len(pairs) >= 8:
                q = [min(d * d * (1 + self.phi) / 2, self.clip**2) for d in pairs]
                r2 = max(float(np.mean(q)) / self.kappa, 1.0)
                stat = max(*self.up, *self.dn)
                dev = [self._clip(sign * (vals[i] - self.mu), lim) for i in valid if i >= first]
                lean = sum(dev) / len(dev) * (1 - self.phi) / self.sig
                glr = 0.5 * len(dev) * lean * lean / r2
                recurring = self.vlast > 0 and self.n - self.vlast <= 32
                persists = recurring and self.n - self.vfirst >= 32
                if r2 > self.spread_veto**2 * stat / self.h and glr < 2 * self.h and not persists:
                    if not recurring:
                        self.vfirst = self.n
                    self.vlast = self.n
                    self.up = [u / r2 for u in self.up]
                    self.dn = [d / r2 for d in self.dn]
                    return None
        if early:
            first = valid[0]  # dated before the ring: all of it is after the shift
        post = [vals[i] for i in valid if i >= first]
        after = float(np.median(post))
        before = self.mu
        self.up = [0.0] * len(self.shifts)
        self.dn = [0.0] * len(self.shifts)
        self.run = [0.0, 0.0]
        self.jr = 0
        self.vfirst = self.vlast = 0
        self.ring = [(tt, v if i >= first else math.nan) for i, (tt, v) in enumerate(self.ring)]
        self.n = len(post)
        if self.n >= self.burn_in:
            self._baseline()
        if abs(after - before) < self.min_rel_change * max(abs(before), self.abs_floor):
            return None
        return RefHit(t, onset, before, after)

    def _baseline(self) -> None:
        vals = np.array([v for _, v in self.ring])
        fin = np.isfinite(vals)
        if self.ns == 0:
            self._first_baseline(vals, fin)
        mu = float(np.median(vals[fin]))
        self.mu = mu
        self.dprev = self._clip((vals[fin][-1] - mu) / self.sig, 1e6)
        self.uprev = self.ulprev = 0.0
        self.nb = int(fin.sum())
        self.n = max(self.n, self.burn_in)
        self.ring = [(tt, math.nan) for tt, _ in self.ring]
        self.jr = 0
        self.up = [0.0] * len(self.shifts)
        self.dn = [0.0] * len(self.shifts)
        self.run = [0.0, 0.0]

    def _first_baseline(self, vals: np.ndarray, fin: np.ndarray) -> None:
        c = self.clip
        x = vals[fin]
        mu = float(np.median(x))
        d = x - mu
        mad = float(np.median(np.abs(d))) * 1.4826
        floor = max(self.rel_floor * abs(mu), self.abs_floor)
        sx = max(mad if mad > 0 else float(np.mean(np.abs(d))) * math.sqrt(math.pi / 2), floor)
        dc = np.clip(d / sx, -c, c)
        est = float(np.clip((dc[1:] * dc[:-1]).sum() / max((dc * dc).sum(), 1e-12), -1, 1))
        phi = self._phi_used(est, float(x.size))
        e = d[1:] - phi * d[:-1]
        sig = max(sx * math.sqrt(max(1 - est * est, 0.0)), floor)
        for _ in range(3):
            sig = max(
                math.sqrt(float(np.mean(np.minimum(e * e, (c * sig) ** 2))) / self.kappa), floor
            )
        self.sig, self.phi = sig, phi
        self.c0 = (sx / sig) ** 2
        self.c1 = est * self.c0
        self.c2 = est * est * self.c0
        self.lprev = 0.0
        self.lprev2 = 0.0
        self.lm = 0.0
        self.lv = self.kappa / (2 * self.lrv_window - 1) if self.lrv_window > 0 else 0.0
        self.ns = int(x.size)
