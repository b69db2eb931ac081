"""Vectorised per-window physics: roofline, tiling, collectives, power/thermal/clock, queueing.

All arrays are (D,) per device or (D, L) per device x layer type; there is no
per-device Python loop. One `Physics.step` call produces one window `Frame`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sim.fleet import F64, I64, BoolA, Fleet

LAUNCH_S = 4e-6  # fixed cost per kernel launch (launch + tail effect)
COLLECTIVE_LAT_S = 20e-6  # per collective call
LINK_EFF = 0.8  # achievable share of link bandwidth for ring collectives
THERMAL_TAU_S = 60.0
THROTTLE_SLOPE = 0.05  # clock share lost per degC above the throttle temperature
PREFETCH_DEPTH = 8.0  # training input pipeline keeps this many batches ready
MAX_QUEUE_S = 30.0


@dataclass(frozen=True, slots=True)
class NoiseSpec:
    """Heterogeneity and noise of a fleet; `NoiseSpec.off()` gives the noise-free model."""

    device_sigma: float = 0.02  # persistent per-device efficiency offset (log-normal)
    straggler_frac: float = 0.01  # devices with a persistent slowdown
    straggler_factor: float = 0.88
    wander_sigma: float = 0.01  # stationary sd of the AR(1) log-efficiency wander
    wander_phi: float = 0.97
    white_sigma: float = 0.015  # scale of the Student-t multiplicative noise
    t_df: float = 4.0
    outlier_rate: float = 2e-4  # one-window outliers per device x layer x window
    silence_rate: float = 0.0  # new silences per device x window
    silence_mean_windows: float = 3.0
    enabled: bool = True

    @staticmethod
    def off() -> NoiseSpec:
        """No noise, no heterogeneity: the expected value of the model."""
        return NoiseSpec(0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 3.0, enabled=False)


class Modifiers:
    """Per-window fault effects; arrays are created only when a fault touches them."""

    def __init__(self, n: int, n_layers: int, remap: I64 | None) -> None:
        self.n = n
        self.n_layers = n_layers
        self._remap = remap
        self.fallback: F64 | None = None  # share of ops on fallback kernels
        self.fallback_slow: F64 | None = None  # time factor of a fallback op vs the primary
        self.kernel: I64 | None = None  # kernel-name row override, -1 = default
        self.tile: F64 | None = None  # tile size relative to the tuned one
        self.hit_scale: F64 | None = None
        self.occ_scale: F64 | None = None
        self.eff_scale: F64 | None = None
        self.spill_frac: F64 | None = None  # spill bytes as a share of activation bytes
        self.contention: F64 | None = None  # (D,) collective time factor from link contention
        self.cooling: F64 | None = None  # (D,) thermal resistance factor (1 = healthy)
        self.ingress_delay_ms: F64 | None = None  # (D,) extra admission delay at the router
        self.quality_delta: F64 | None = None  # (D,)
        self.model_row: I64 | None = None  # (D,) model@version override, -1 = default

    def local(self, devices: I64) -> I64:
        """Map global device indices to this run's rows (a label run may cover a subset)."""
        if self._remap is None:
            return devices
        loc = self._remap[devices]
        return loc[loc >= 0]

    def dl(self, name: str, fill: float) -> F64:
        """The (D, L) float array `name`, created filled with `fill` on first use."""
        arr: F64 | None = getattr(self, name)
        if arr is None:
            arr = np.full((self.n, self.n_layers), fill)
            setattr(self, name, arr)
        return arr

    def d(self, name: str, fill: float) -> F64:
        """The (D,) float array `name`, created filled with `fill` on first use."""
        arr: F64 | None = getattr(self, name)
        if arr is None:
            arr = np.full(self.n, fill)
            setattr(self, name, arr)
        return arr

    def kernel_rows(self) -> I64:
        """The (D, L) kernel override array (-1 = default kernel)."""
        if self.kernel is None:
            self.kernel = np.full((self.n, self.n_layers), -1, dtype=np.int64)
        return self.kernel

    def model_rows(self) -> I64:
        """The (D,) model override array (-1 = pool's base version)."""
        if self.model_row is None:
            self.model_row = np.full(self.n, -1, dtype=np.int64)
        return self.model_row


class Effect(Protocol):
    """A fault's effect on one window, given the tokens per step each device runs."""

    def active(self, t_start: float) -> bool:
        """Whether the window starting at `t_start` is affected."""
        ...

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        """Write the effect into `mods` (vectorised over the affected devices)."""
        ...


@dataclass(slots=True)
class Frame:
    """One window of the whole fleet as arrays, ready to encode."""

    k: int
    ts: float
    emit: BoolA  # (D,) devices that report this window
    flops: F64
    busy_s: F64
    cycles: F64
    stall: F64
    occupancy: F64
    bytes_hbm: F64
    sram_hit: F64
    spill: F64
    sync: F64
    kernel: I64
    fallback: F64
    req_rate: F64
    queue_depth: F64
    queue_wait_ms: F64
    batch: F64
    power_w: F64
    temp_c: F64
    clock_mhz: F64
    p50: F64
    p95: F64
    p99: F64
    quality: F64
    errors: F64
    model_row: I64
    in_burst: BoolA  # (D,) whether the device's pool is in a burst episode (ground truth)

    def layer_samples(self, present: BoolA) -> int:
        """Device x layer samples this frame carries."""
        return int(present[self.emit].sum())


class Physics:
    """State and step function of the fleet model; deterministic for a seed."""

    def __init__(
        self,
        fleet: Fleet,
        effects: list[Effect],
        noise: NoiseSpec,
        *,
        seed: int,
        window_s: float,
        start_ts: float,
        subset: I64 | None = None,
        burn_in: int = 24,
    ) -> None:
        self.full = fleet
        self.f = fleet if subset is None else _SubFleet(fleet, subset)
        self.remap: I64 | None = None
        if subset is not None:
            self.remap = np.full(fleet.n, -1, dtype=np.int64)
            self.remap[subset] = np.arange(len(subset))
        self.effects = effects
        self.noise = noise
        self.w = window_s
        self.start = start_ts
        self.rng = np.random.Generator(np.random.PCG64(seed))
        f = self.f
        n = f.n
        dev = f.dev
        if noise.enabled:
            offs = np.exp(self.rng.normal(0.0, noise.device_sigma, n))
            strag = self.rng.random(n) < noise.straggler_frac
            self.dev_eff: F64 = np.where(strag, offs * noise.straggler_factor, offs)
            self.share: F64 = np.exp(self.rng.normal(0.0, 0.05, n))  # router imbalance
            self.inlet: F64 = self.rng.uniform(25.0, 32.0, n)
            self.wander: F64 = self.rng.normal(0.0, noise.wander_sigma, n)
        else:
            self.dev_eff = np.ones(n)
            self.share = np.ones(n)
            self.inlet = np.full(n, 28.5)
            self.wander = np.zeros(n)
        self.pool_base_load = np.array([p.traffic.base_load for p in f.pools])[f.pool_idx]
        self.temp: F64 = self.inlet + dev["r_th"] * 0.6 * dev["tdp"]
        self.throttle: F64 = np.ones(n)
        self.queue: F64 = np.zeros(n)
        self.silent_left: I64 = np.zeros(n, dtype=np.int64)
        self.loader_rate: F64 = np.zeros(n)
        self._last_rate: F64 = np.zeros(n)
        self.peak_clk: F64 = dev["peak"] * dev["clock_ratio"]
        self.alpha = 1.0 - math.exp(-window_s / THERMAL_TAU_S)
        for k in range(-burn_in, 0):
            self.step(k, burn=True)
        # the input pipeline offers what a healthy device consumes; it does not track slowdowns
        self.loader_rate = self._last_rate.copy()

    def step(self, k: int, *, burn: bool = False) -> Frame:
        """Advance one window (window k ends at start + (k+1)*window_s) and return it."""
        f, nz, rng = self.f, self.noise, self.rng
        n, n_l = f.n, len(f.layers)
        dev = f.dev
        w = self.w
        t_end = self.start + (k + 1) * w
        t_start = t_end - w
        on = nz.enabled

        # --- traffic: the router sizes batches for its tick at the offered load
        loads = np.array([p.traffic.load(t_end) for p in f.pools])
        bursting = np.array([p.traffic.in_burst(t_end) for p in f.pools])
        load = loads[f.pool_idx] * self.share
        gen, tick, bmax = dev["gen"], dev["tick"], dev["max_batch"]
        target = self.pool_base_load * bmax * load  # sequences in flight at this load
        lam = target / (gen * tick)  # requests/s (Little's law)
        if on:
            lam = lam * (1.0 + rng.standard_normal(n) / np.sqrt(np.maximum(lam * w, 1.0)))
            lam = np.maximum(lam, 0.0)
        b_seq = np.clip(lam * gen * tick, 1.0, bmax)
        train = f.is_train
        tokens = np.where(train, dev["tokens_per_step"], b_seq * dev["tok_per_seq"])

        mods = Modifiers(n, n_l, self.remap)
        if not burn:
            for eff in self.effects:
                if eff.active(t_start):
                    eff.apply(mods, self.full, tokens)

        # --- noise: AR(1) wander per device, Student-t (normal / chi) per device x layer
        if on:
            phi = nz.wander_phi
            self.wander = phi * self.wander + nz.wander_sigma * math.sqrt(
                1 - phi * phi
            ) * rng.standard_normal(n)
            scale = np.sqrt(nz.t_df / rng.chisquare(nz.t_df, n)) * nz.white_sigma
            z = rng.standard_normal((n, n_l)) * scale[:, None]
            effn = np.exp(z) * (self.dev_eff * np.exp(self.wander))[:, None]
            n_out = int(rng.poisson(nz.outlier_rate * n * n_l))
            if n_out and not burn:
                flat = rng.integers(0, n * n_l, n_out)
                effn.ravel()[flat] *= rng.uniform(0.55, 0.8, n_out)
        else:
            z = np.zeros((n, n_l))
            effn = np.ones((n, n_l))

        # --- per layer: tiling -> SRAM hits -> HBM bytes; roofline time
        tok = tokens[:, None]
        flops = f.flops_tok * tok
        tile = mods.tile if mods.tile is not None else 1.0
        hit = f.sram_hit if mods.hit_scale is None else f.sram_hit * mods.hit_scale
        if on:
            hit = hit * (1.0 + 0.1 * z)
        hit = np.clip(hit, 0.0, 0.995)
        act = f.act_bytes_tok * tok
        spill = act * mods.spill_frac if mods.spill_frac is not None else np.zeros((n, n_l))
        bytes_hbm = f.weight_bytes + act + f.reuse_bytes_tok * tok / tile * (1.0 - hit) + spill
        ec = f.eff_c * effn
        if mods.eff_scale is not None:
            ec = ec * mods.eff_scale
        ec = np.minimum(ec, 0.99)
        em = np.minimum(f.eff_m * effn, 0.99)
        clk = dev["clock_ratio"] * self.throttle
        t_comp = flops / (dev["peak"] * clk)[:, None] / ec
        t_mem = bytes_hbm / dev["bw"][:, None] / em
        t = np.maximum(t_comp, t_mem)
        if mods.fallback is not None and mods.fallback_slow is not None:
            t = t * (1.0 + mods.fallback * (mods.fallback_slow - 1.0))
        t = t + f.kernels * LAUNCH_S
        ratio = t_mem / np.maximum(t_comp, 1e-30)
        r15 = ratio * np.sqrt(ratio)
        stall = 0.03 + 0.92 * r15 / (1.0 + r15)
        occ = f.occupancy if mods.occ_scale is None else f.occupancy * mods.occ_scale
        if on:
            stall = stall * np.exp(-0.5 * z)
            occ = occ * np.exp(0.3 * z)
        sync = np.zeros((n, n_l))

        # --- collectives: ring time over the link, then wait for the slowest host peer
        a = f.allreduce_col
        if a >= 0:
            has = f.present[:, a]
            comm_tp = dev["comm_tok"] * tokens
            comm_dp = dev["comm_step"]
            t_x = (comm_tp / dev["nvlink"] + comm_dp / dev["net"]) / LINK_EFF / effn[:, a]
            t_x = t_x + f.kernels[:, a] * COLLECTIVE_LAT_S
            t[:, a] = 0.0
            own = t.sum(axis=1) + t_x
            group = np.maximum.reduceat(own, f.host_starts)[f.host_idx]
            wait = group - own + 0.03 * t_x
            if mods.contention is not None:
                wait = wait + (mods.contention - 1.0) * t_x
            msg = comm_tp + comm_dp
            t[:, a] = np.where(has, t_x + wait, 0.0)
            flops[:, a] = np.where(has, msg / 2.0, 0.0)  # one add per bf16 element reduced
            bytes_hbm[:, a] = np.where(has, 2.0 * msg, 0.0)
            sync[:, a] = np.where(has, wait, 0.0)
            stall[:, a] = 0.55 * (np.exp(-0.5 * z[:, a]) if on else 1.0)
        stall = np.clip(stall, 0.01, 0.97)
        occ = np.clip(occ, 0.01, 1.0)

        # --- steps in the window: training runs flat out, serving runs what demand needs
        step = t.sum(axis=1)
        cap = 0.98 * w / step
        duty_train = 0.97 * (1.0 + (0.004 * rng.standard_normal(n) if on else 0.0))
        needed = lam * w * gen / b_seq + self.queue * gen / b_seq
        n_steps = np.where(train, duty_train * w / step, np.minimum(needed, cap))
        backlog = np.maximum(needed - n_steps, 0.0) * b_seq / gen
        # the router sheds what would wait longer than MAX_QUEUE_S; shed requests are errors
        shed = np.maximum(backlog - lam * MAX_QUEUE_S, 0.0)
        self.queue = np.where(train, 0.0, backlog - shed)
        duty = n_steps * step / w

        flops_w = flops * n_steps[:, None]
        busy = t * n_steps[:, None]

        # --- power, temperature, clock: throttling feeds back into the next window
        peak = dev["peak"]
        dev_mfu = flops_w.sum(axis=1) / (w * peak)
        activity = np.clip(0.35 * duty + 0.65 * np.minimum(dev_mfu / 0.45, 1.0), 0.0, 1.0)
        power = dev["idle"] + (dev["tdp"] - dev["idle"]) * activity * self.throttle**2
        cooling = mods.cooling if mods.cooling is not None else 1.0
        t_ss = self.inlet + dev["r_th"] * cooling * power
        self.temp = self.temp + self.alpha * (t_ss - self.temp)
        clock_mhz = dev["max_clock"] * clk
        self.throttle = np.clip(1.0 - THROTTLE_SLOPE * (self.temp - dev["throttle"]), 0.5, 1.0)

        # --- ingress and SLO
        rate = np.where(train, dev["micro_batch"] * n_steps / w, lam)
        self._last_rate = rate
        # router admission wait is ingress; contention inside a busy engine is latency only
        wait_ms = 1000.0 * (0.5 * tick + self.queue / np.maximum(lam, 1e-9))
        if mods.ingress_delay_ms is not None:
            wait_ms = wait_ms + mods.ingress_delay_ms
        rho = np.minimum(duty, 0.97)
        service_ms = 1000.0 * gen * step
        contention_ms = 0.2 * service_ms * rho**6 / (1.0 - rho)
        queued = wait_ms + contention_ms
        lat_noise = np.exp(0.03 * rng.standard_normal(n)) if on else np.ones(n)
        step_ms = 1000.0 * step / duty_train
        # exponential waiting tails: quantile q adds -ln(1-q) mean waits, so p99 grows fastest
        p50 = np.where(train, step_ms, (0.9 * service_ms + 0.69 * queued) * lat_noise)
        p95 = np.where(train, 1.06 * step_ms, (1.5 * service_ms + 3.0 * queued) * lat_noise)
        p99 = np.where(train, 1.12 * step_ms, (2.0 * service_ms + 4.6 * queued) * lat_noise)
        loader = self.loader_rate if not burn else rate
        req_rate = np.where(train, loader, lam)
        q_depth = np.where(train, PREFETCH_DEPTH, lam * wait_ms / 1000.0 + self.queue)
        q_wait = np.where(train, 0.15, wait_ms)
        batch = np.where(train, dev["micro_batch"], b_seq)
        quality = dev["quality"].copy()
        if mods.quality_delta is not None:
            quality = quality + mods.quality_delta
        errors = np.where(train, 0.0, np.round(shed))
        emit = np.ones(n, dtype=np.bool_)
        if on:
            quality = quality + 0.002 * rng.standard_normal(n)
            errors = np.where(train, 0.0, rng.poisson(lam * w * 2e-5) + np.round(shed))
            power = power * np.exp(0.01 * rng.standard_normal(n))
            temp_obs = self.temp + 0.4 * rng.standard_normal(n)
            clock_mhz = clock_mhz * np.exp(0.002 * rng.standard_normal(n))
            req_rate = np.where(train, req_rate * (1.0 + 0.003 * rng.standard_normal(n)), req_rate)
            if nz.silence_rate > 0 and not burn:
                n_sil = int(rng.poisson(nz.silence_rate * n))
                if n_sil:
                    who = rng.integers(0, n, n_sil)
                    self.silent_left[who] = rng.geometric(1.0 / nz.silence_mean_windows, n_sil)
                emit = self.silent_left == 0
                self.silent_left = np.maximum(self.silent_left - 1, 0)
        else:
            temp_obs = self.temp.copy()
        kernel = f.kernel_base
        if mods.kernel is not None:
            kernel = np.where(mods.kernel >= 0, mods.kernel, f.kernel_base)
        model_row = f.base_model_idx
        if mods.model_row is not None:
            model_row = np.where(mods.model_row >= 0, mods.model_row, f.base_model_idx)
        fallback = mods.fallback if mods.fallback is not None else np.zeros((n, n_l))
        n_col = n_steps[:, None]
        cycles = busy * (clock_mhz * 1e6)[:, None]
        return Frame(
            k=k, ts=t_end, emit=emit, flops=flops_w, busy_s=busy, cycles=cycles,
            stall=cycles * stall, occupancy=occ, bytes_hbm=bytes_hbm * n_col, sram_hit=hit,
            spill=spill * n_col, sync=sync * n_col, kernel=kernel, fallback=fallback,
            req_rate=req_rate, queue_depth=q_depth, queue_wait_ms=q_wait, batch=batch,
            power_w=power, temp_c=temp_obs, clock_mhz=clock_mhz, p50=p50, p95=p95, p99=p99,
            quality=np.minimum(quality, 1.0), errors=errors, model_row=model_row,
            in_burst=bursting[f.pool_idx],
        )  # fmt: skip


class _SubFleet(Fleet):
    """A view of whole hosts of a fleet (label runs evaluate only the incident's scope)."""

    def __init__(self, full: Fleet, idx: I64) -> None:  # a view: Fleet.__init__ is not called
        self.pools = full.pools
        self.layers = full.layers
        self.allreduce_col = full.allreduce_col
        self.kernel_names = full.kernel_names
        self.model_names = full.model_names
        self.model_row = full.model_row
        self.n = len(idx)
        hosts = full.host_idx[idx]
        first = np.concatenate([[True], hosts[1:] != hosts[:-1]])
        self.host_starts = np.flatnonzero(first).astype(np.int64)
        self.host_idx = np.cumsum(first).astype(np.int64) - 1
        self.pool_idx = full.pool_idx[idx]
        self.host_names = full.host_names
        self.device_names = [full.device_names[i] for i in idx.tolist()]
        self.base_model_idx = full.base_model_idx[idx]
        for name in (
            "flops_tok", "weight_bytes", "act_bytes_tok", "reuse_bytes_tok", "kernels", "eff_c",
            "eff_m", "occupancy", "sram_hit", "present", "kernel_base", "kernel_fallback",
            "is_train",
        ):  # fmt: skip
            setattr(self, name, getattr(full, name)[idx])
        self.pool_present = full.pool_present
        self.dev = {k: v[idx] for k, v in full.dev.items()}
