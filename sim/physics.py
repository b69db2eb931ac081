"""Vectorised per-window physics: roofline, tiling, collectives, power/thermal/clock, queueing.

All arrays are (D,) per device or (D, L) per device x layer type; there is no
per-device Python loop. One `Physics.step` call produces one window `Frame`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from monitor.arrays import F64, I64, Bools
from sim.fleet import Fleet

LAUNCH_S = 4e-6  # fixed cost per kernel launch (launch + tail effect)
COLLECTIVE_LAT_S = 20e-6  # per collective call
LINK_EFF = 0.8  # achievable share of link bandwidth for ring collectives
THERMAL_TAU_S = 60.0
THROTTLE_SLOPE = 0.05  # clock share lost per degC above the throttle temperature
PREFETCH_DEPTH = 8.0  # training input pipeline keeps this many batches ready


@dataclass(frozen=True, slots=True)
class NoiseSpec:
    """Heterogeneity and noise of a fleet; `NoiseSpec.off()` gives the noise-free model."""

    device_sigma: float = 0.02  # persistent per-device efficiency offset (log-normal)
    straggler_frac: float = 0.01  # devices with a persistent slowdown
    straggler_factor: float = 0.88
    wander_sigma: float = 0.01  # stationary sd of the AR(1) log-efficiency wander
    wander_phi: float = 0.97
    white_sigma: float = 0.015  # scale of the Student-t (4 d.o.f.) multiplicative noise
    outlier_rate: float = 2e-4  # one-window outliers per device x layer x window
    silence_rate: float = 0.0  # new silences per device x window
    silence_mean_windows: float = 3.0
    enabled: bool = True
    # Tail shape of the white noise: its scale is (4/chi2_4)^(tail/2), so 1 is Student-t with
    # 4 d.o.f., 0 is Gaussian and larger values have heavier tails.
    tail: float = 1.0
    # Quality as measured on the window's requests: 1 - (failed / served), failures Poisson.
    # Otherwise a Gaussian reading (sd 0.002) of the model's score.
    quality_sampling: bool = False

    @staticmethod
    def off() -> NoiseSpec:
        """No noise, no heterogeneity: the expected value of the model."""
        return NoiseSpec(0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, enabled=False)


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
        self.sync_scale: F64 | None = None  # (D,) factor on the collective wait (a slow NIC)
        self.flops_scale: F64 | None = None  # (D, L) per-token FLOPs of a swapped-in model
        self.bytes_scale: F64 | None = None  # (D, L) per-token activation and re-read bytes
        self.weight_scale: F64 | None = None  # (D, L) weight bytes per step
        self.cooling: F64 | None = None  # (D,) thermal resistance factor (1 = healthy)
        self.ingress_delay_ms: F64 | None = None  # (D,) extra admission delay at the router
        self.quality_delta: F64 | None = None  # (D,)
        self.error_rate: F64 | None = None  # (D,) failed requests per request a fault adds
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
    emit: Bools  # (D,) devices that report this window
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
    in_burst: Bools  # (D,) whether the device's pool is in a burst episode (ground truth)

    def layer_samples(self, layers_per_device: F64) -> int:
        """Device x layer samples this frame carries (`layers_per_device`: Fleet.layer_counts)."""
        return int(layers_per_device @ self.emit)


class _NoisePool:
    """Standard normals drawn once; each window reads a random slice (drawing is the hot spot).

    Per stream the values stay independent across windows (slices start at random
    offsets in a pool several times larger than one window needs), at a fraction
    of the cost of fresh draws.
    """

    def __init__(self, rng: np.random.Generator, need: int) -> None:
        self.rng = rng
        self.buf = rng.standard_normal(max(1 << 20, 4 * need), dtype=np.float32)
        self.buf.flags.writeable = False

    def take(self, rows: int, cols: int) -> npt.NDArray[np.float32]:
        """A read-only (rows, cols) block of standard normals."""
        m = rows * cols
        o = int(self.rng.integers(0, len(self.buf) - m + 1))
        return self.buf[o : o + m].reshape(rows, cols)


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
        join_ts: F64 | None = None,
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
        n_l = len(f.layers)
        dev = f.dev
        # Every draw is made for the whole fleet and then cut to the subset, so a label run
        # on a few hosts sees exactly the noise those devices get in the full run.
        big = fleet.n
        self._sel = subset
        self._big = big
        if noise.enabled:
            rng = self.rng
            offs = np.exp(rng.normal(0.0, noise.device_sigma, big))
            strag = rng.random(big) < noise.straggler_frac
            self.dev_eff: F64 = self._cut(np.where(strag, offs * noise.straggler_factor, offs))
            self.share: F64 = self._cut(np.exp(rng.normal(0.0, 0.05, big)))  # router imbalance
            self.inlet: F64 = self._cut(rng.uniform(25.0, 32.0, big))
            self.wander: F64 = self._cut(rng.normal(0.0, noise.wander_sigma, big))
            self.pool = _NoisePool(rng, big * (n_l + _DEV_NOISE_ROWS))
        else:
            self.dev_eff = np.ones(n)
            self.share = np.ones(n)
            self.inlet = np.full(n, 28.5)
            self.wander = np.zeros(n)
        self.tr: F64 = f.is_train.astype(np.float64)  # blend weights instead of np.where
        self.sv: F64 = 1.0 - self.tr
        self.base_load = np.array([p.traffic.base_load for p in f.pools])[f.pool_idx]
        self.tick: F64 = dev["tick"]
        self.max_queue: F64 = np.array([p.traffic.max_queue_s for p in f.pools])[f.pool_idx]
        head = np.array([p.traffic.headroom or 0.0 for p in f.pools])[f.pool_idx]
        self.saturating: Bools = head > 0
        if self.saturating.any():
            # the router sizes batches for the engine's step at full batch, so the batch pins
            # at max_batch exactly when the offered load reaches capacity
            full = full_batch_step(f) / DUTY_CAP
            self.tick = np.where(self.saturating, full, self.tick)
            self.base_load = np.where(self.saturating, 1.0 / np.maximum(head, 1e-9), self.base_load)
        self.join_ts: F64 | None = None if join_ts is None else self._cut(join_ts)
        self._join_full = join_ts
        # draws added after the original model come from their own stream, so scenarios that
        # do not use them keep their bytes
        self.rng_q = np.random.Generator(np.random.PCG64([seed, 0x9A11]))
        self.temp: F64 = self.inlet + dev["r_th"] * 0.6 * dev["tdp"]
        self.throttle: F64 = np.ones(n)
        self.queue: F64 = np.zeros(n)
        self.silent_left: I64 = np.zeros(n, dtype=np.int64)
        self.loader_rate: F64 = np.zeros(n)
        self._last_rate: F64 = np.zeros(n)
        self.alpha = 1.0 - math.exp(-window_s / THERMAL_TAU_S)
        self._zeros: F64 = np.zeros((n, n_l))
        self._zeros.flags.writeable = False  # shared by every frame without such an effect
        self._ones: F64 = np.ones((n, n_l))
        self._ones.flags.writeable = False
        self._sum_l: F64 = np.ones(n_l)  # row sums as a mat-vec: much faster than sum(axis=1)
        self._launch: F64 = f.kernels * LAUNCH_S
        self._hit_noise: F64 = 0.1 * f.sram_hit
        self._occ_noise: F64 = 0.3 * f.occupancy
        self._peak_col: F64 = dev["peak"][:, None]
        self._bw_col: F64 = dev["bw"][:, None]
        for k in range(-burn_in, 0):
            self.step(k, burn=True)
        # the input pipeline offers what a healthy device consumes; it does not track slowdowns
        self.loader_rate = self._last_rate.copy()

    def _cut(self, x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Rows of this run's devices from a whole-fleet array."""
        return x if self._sel is None else x[self._sel]

    def step(self, k: int, *, burn: bool = False) -> Frame:
        """Advance one window (window k ends at start + (k+1)*window_s) and return it."""
        f, nz, rng = self.f, self.noise, self.rng
        n, n_l = f.n, len(f.layers)
        dev = f.dev
        tr, sv = self.tr, self.sv
        w = self.w
        t_end = self.start + (k + 1) * w
        t_start = t_end - w
        on = nz.enabled
        big = self._big
        g = self.pool.take(_DEV_NOISE_ROWS, big) if on else None
        if g is not None and self._sel is not None:
            g = g[:, self._sel]

        # --- traffic: the router sizes batches for its tick at the offered load
        loads = np.array([p.traffic.load(t_end) for p in f.pools])
        bursting = np.array([p.traffic.in_burst(t_end) for p in f.pools])
        gen, tick, bmax = dev["gen"], self.tick, dev["max_batch"]
        # sequences in flight at this load -> requests/s by Little's law
        lam = self.base_load * bmax * loads[f.pool_idx] * self.share / (gen * tick)
        if self._join_full is not None:
            # a pool's load spreads over the devices that have joined (counted fleet-wide)
            full = self.full.pool_idx
            n_pool = np.bincount(full, minlength=len(f.pools))
            joined = np.bincount(full, weights=self._join_full < t_end, minlength=len(f.pools))
            lam = lam * (n_pool / np.maximum(joined, 1.0))[f.pool_idx]
        if g is not None:  # Poisson arrivals: relative noise 1/sqrt(count)
            lam = np.maximum(lam * (1.0 + g[0] / np.sqrt(np.maximum(lam * w, 1.0))), 0.0)
        b_seq = np.clip(lam * gen * tick, 1.0, bmax)
        tokens = tr * dev["tokens_per_step"] + sv * b_seq * dev["tok_per_seq"]

        mods = Modifiers(n, n_l, self.remap)
        if not burn:
            for eff in self.effects:
                if eff.active(t_start):
                    eff.apply(mods, self.full, tokens)

        # --- noise: AR(1) wander per device, Student-t (normal / chi) per device x layer
        z: npt.NDArray[np.float32] | None = None
        if g is not None:
            phi = nz.wander_phi
            self.wander = phi * self.wander + nz.wander_sigma * math.sqrt(1 - phi * phi) * g[1]
            chi2 = g[9] * g[9] + g[10] * g[10] + g[11] * g[11] + g[12] * g[12]  # 4 d.o.f.
            if nz.tail == 1.0:
                scale = np.sqrt(4.0 / np.maximum(chi2, 1e-3)) * nz.white_sigma
            else:
                scale = (4.0 / np.maximum(chi2, 1e-3)) ** (0.5 * nz.tail) * nz.white_sigma
            z = self._cut(self.pool.take(big, n_l)) * scale[:, None]
            effn = np.exp(z).astype(np.float64)
            effn *= (self.dev_eff * np.exp(self.wander))[:, None]
            n_out = int(rng.poisson(nz.outlier_rate * big * n_l))
            if n_out and not burn:
                d_out, l_out = np.divmod(rng.integers(0, big * n_l, n_out), n_l)
                factor = rng.uniform(0.55, 0.8, n_out)
                if self.remap is not None:
                    d_out = self.remap[d_out]
                    keep = d_out >= 0
                    d_out, l_out, factor = d_out[keep], l_out[keep], factor[keep]
                effn[d_out, l_out] *= factor
        else:
            effn = self._ones

        # --- per layer: tiling -> SRAM hits -> HBM bytes; roofline time. The (D, L) passes
        # dominate the cost, so they run in place.
        tok = tokens[:, None]
        flops = f.flops_tok * tok
        if mods.flops_scale is not None:
            flops *= mods.flops_scale
        hit = f.sram_hit if mods.hit_scale is None else f.sram_hit * mods.hit_scale
        if z is not None:
            hit = hit + self._hit_noise * z
        hit = np.clip(hit, 0.0, 0.995)
        reuse = f.reuse_bytes_tok * tok
        if mods.bytes_scale is not None:
            reuse *= mods.bytes_scale
        if mods.tile is not None:
            reuse /= mods.tile
        reuse *= 1.0 - hit
        bytes_hbm = f.act_bytes_tok * tok
        if mods.bytes_scale is not None:
            bytes_hbm *= mods.bytes_scale
        spill = self._zeros
        if mods.spill_frac is not None:
            spill = bytes_hbm * mods.spill_frac
            reuse += spill
        bytes_hbm += (
            f.weight_bytes if mods.weight_scale is None else f.weight_bytes * mods.weight_scale
        )
        bytes_hbm += reuse
        ec = f.eff_c * effn
        if mods.eff_scale is not None:
            ec *= mods.eff_scale
        np.minimum(ec, 0.99, out=ec)
        em = f.eff_m * effn
        np.minimum(em, 0.99, out=em)
        clk = dev["clock_ratio"] * self.throttle
        t_comp = flops / self._peak_col
        t_comp /= clk[:, None]
        t_comp /= ec
        t_mem = bytes_hbm / self._bw_col
        t_mem /= em
        t = np.maximum(t_comp, t_mem)
        if mods.fallback is not None and mods.fallback_slow is not None:
            t *= 1.0 + mods.fallback * (mods.fallback_slow - 1.0)
        t += self._launch
        # the stall share follows the memory share of the roofline time
        t_comp += t_mem
        t_comp += 1e-30  # absent layer types have no time at all
        stall = np.divide(t_mem, t_comp, out=t_comp)
        stall *= 0.92
        stall += 0.03
        occ = f.occupancy if mods.occ_scale is None else f.occupancy * mods.occ_scale
        if z is not None:
            stall *= 1.0 - 0.5 * z
            occ = occ + self._occ_noise * z
        sync = np.zeros((n, n_l))

        # --- collectives: ring time over the link, then wait for the slowest host peer
        a = f.allreduce_col
        if a >= 0:
            has = f.present[:, a]
            comm_tp = dev["comm_tok"] * tokens
            comm_dp = dev["comm_step"]
            t_x = (comm_tp / dev["nvlink"] + comm_dp / dev["net"]) / (LINK_EFF * effn[:, a])
            t_x += f.kernels[:, a] * COLLECTIVE_LAT_S
            t[:, a] = 0.0
            own = t @ self._sum_l + t_x
            group = np.maximum.reduceat(own, f.host_starts)[f.host_idx]
            wait = group - own + 0.03 * t_x
            if mods.contention is not None:
                wait += (mods.contention - 1.0) * t_x
            if mods.sync_scale is not None:
                wait *= mods.sync_scale
            msg = comm_tp + comm_dp
            t[:, a] = np.where(has, t_x + wait, 0.0)
            flops[:, a] = np.where(has, msg / 2.0, 0.0)  # one add per bf16 element reduced
            bytes_hbm[:, a] = np.where(has, 2.0 * msg, 0.0)
            sync[:, a] = np.where(has, wait, 0.0)
            stall[:, a] = 0.55 * (1.0 - 0.5 * z[:, a]) if z is not None else 0.55
        np.clip(stall, 0.01, 0.97, out=stall)
        occ = np.clip(occ, 0.01, 1.0)

        # --- steps in the window: training runs flat out, serving runs what demand needs
        step = t @ self._sum_l
        duty_train = 0.97 * (1.0 + 0.004 * g[2]) if g is not None else np.full(n, 0.97)
        needed = (lam * w + self.queue) * gen / b_seq
        n_steps = tr * duty_train * w / step + sv * np.minimum(needed, DUTY_CAP * w / step)
        backlog = np.maximum(needed - n_steps, 0.0) * b_seq / gen
        # the router sheds what would wait longer than max_queue_s; shed requests are errors
        shed = np.maximum(backlog - lam * self.max_queue, 0.0)
        self.queue = sv * (backlog - shed)
        duty = n_steps * step / w

        n_col = n_steps[:, None]
        flops *= n_col
        busy = t
        busy *= n_col
        bytes_hbm *= n_col
        if a >= 0:
            sync[:, a] *= n_steps
        if spill is not self._zeros:
            spill *= n_col

        # --- power, temperature, clock: throttling feeds back into the next window
        dev_mfu = (flops @ self._sum_l) / (w * dev["peak"])
        activity = np.clip(0.35 * duty + 0.65 * np.minimum(dev_mfu / 0.45, 1.0), 0.0, 1.0)
        power = dev["idle"] + (dev["tdp"] - dev["idle"]) * activity * self.throttle**2
        cooling = mods.cooling if mods.cooling is not None else 1.0
        t_ss = self.inlet + dev["r_th"] * cooling * power
        self.temp = self.temp + self.alpha * (t_ss - self.temp)
        clock_mhz = dev["max_clock"] * clk
        self.throttle = np.clip(1.0 - THROTTLE_SLOPE * (self.temp - dev["throttle"]), 0.5, 1.0)

        # --- ingress: the router's admission wait; contention inside the engine is latency only
        self._last_rate = tr * dev["micro_batch"] * n_steps / w + sv * lam
        wait_ms = 1000.0 * (0.5 * tick + self.queue / np.maximum(lam, 1e-9))
        if self.saturating.any():
            # waiting for a batch slot: half a step at low load, growing like rho/(1-rho)
            rho_w = np.minimum(duty / DUTY_CAP, 0.97)
            wait_ms += np.where(self.saturating, 500.0 * tick * rho_w / (1.0 - rho_w), 0.0)
        if mods.ingress_delay_ms is not None:
            wait_ms += mods.ingress_delay_ms
        loader = self._last_rate if burn else self.loader_rate
        req_rate = tr * loader + sv * lam
        q_depth = tr * PREFETCH_DEPTH + sv * (lam * wait_ms / 1000.0 + self.queue)
        q_wait = tr * 0.15 + sv * wait_ms
        batch = tr * dev["micro_batch"] + sv * b_seq

        # --- SLO: exponential waiting tails, quantile q adds -ln(1-q) mean waits
        rho = np.minimum(duty, 0.97)
        service_ms = 1000.0 * gen * step
        queued = wait_ms + 0.5 * service_ms * rho**3 / (1.0 - rho)
        fifo: F64 | float = 0.0
        if self.saturating.any():
            # a continuously batching engine: contention is already in the step time; the
            # exponential part is the slot wait, the backlog is waited out in FIFO order
            # (every request waits about as long)
            fifo = np.where(self.saturating, 1000.0 * self.queue / np.maximum(lam, 1e-9), 0.0)
            queued = np.where(self.saturating, wait_ms - fifo, queued)
        step_ms = 1000.0 * step / duty_train
        lat = np.exp(0.03 * g[3]) * sv if g is not None else sv
        p50 = tr * step_ms + lat * (0.9 * service_ms + 0.69 * queued + fifo)
        p95 = tr * 1.06 * step_ms + lat * (1.5 * service_ms + 3.0 * queued + fifo)
        p99 = tr * 1.12 * step_ms + lat * (2.0 * service_ms + 4.6 * queued + fifo)
        quality = dev["quality"]
        if mods.quality_delta is not None:
            quality = quality + mods.quality_delta
        fail = BASE_ERROR_RATE if mods.error_rate is None else BASE_ERROR_RATE + mods.error_rate
        err_mean = sv * (lam * w * fail)
        emit = np.ones(n, dtype=np.bool_)
        temp_obs = self.temp
        if nz.quality_sampling:
            quality = self._sampled_quality(quality, sv * lam * w)
        elif g is not None:
            quality = quality + 0.002 * g[4]
        if g is not None:
            # randomised rounding keeps the mean error count
            err_mean = np.floor(err_mean + self._cut(rng.random(big, dtype=np.float32)))
            power = power * (1.0 + 0.01 * g[5])
            temp_obs = self.temp + 0.4 * g[6]
            clock_mhz = clock_mhz * (1.0 + 0.002 * g[7])
            req_rate = req_rate * (1.0 + 0.003 * tr * g[8])
            if nz.silence_rate > 0 and not burn:
                n_sil = int(rng.poisson(nz.silence_rate * big))
                if n_sil:
                    who = rng.integers(0, big, n_sil)
                    length = rng.geometric(1.0 / nz.silence_mean_windows, n_sil)
                    if self.remap is not None:
                        who = self.remap[who]
                        length = length[who >= 0]
                        who = who[who >= 0]
                    self.silent_left[who] = length
                emit = self.silent_left == 0
                self.silent_left = np.maximum(self.silent_left - 1, 0)
        if self.join_ts is not None:
            emit = emit & (t_end > self.join_ts)  # hosts that have not joined yet do not report
        errors = err_mean + sv * np.round(shed)
        kernel = f.kernel_base
        if mods.kernel is not None:
            kernel = np.where(mods.kernel >= 0, mods.kernel, f.kernel_base)
        model_row = f.base_model_idx
        if mods.model_row is not None:
            model_row = np.where(mods.model_row >= 0, mods.model_row, f.base_model_idx)
        fallback = mods.fallback if mods.fallback is not None else self._zeros
        cycles = busy * (clock_mhz * 1e6)[:, None]
        stall *= cycles
        return Frame(
            k=k,
            ts=t_end,
            emit=emit,
            flops=flops,
            busy_s=busy,
            cycles=cycles,
            stall=stall,
            occupancy=occ,
            bytes_hbm=bytes_hbm,
            sram_hit=hit,
            spill=spill,
            sync=sync,
            kernel=kernel,
            fallback=fallback,
            req_rate=req_rate,
            queue_depth=q_depth,
            queue_wait_ms=q_wait,
            batch=batch,
            power_w=power,
            temp_c=temp_obs,
            clock_mhz=clock_mhz,
            p50=p50,
            p95=p95,
            p99=p99,
            quality=np.minimum(quality, 1.0),
            errors=errors,
            model_row=model_row,
            in_burst=bursting[f.pool_idx],
        )

    def _sampled_quality(self, q: F64, served: F64) -> F64:
        """1 - failed/served over the window's requests, failures Poisson (fleet-wide draws)."""
        u = self._cut(self.rng_q.random(self._big))
        z = self._cut(self.rng_q.standard_normal(self._big))
        n = np.maximum(served, 1.0)
        failed = poisson_quantile(u, z, n * np.clip(1.0 - q, 0.0, 1.0))
        out: F64 = 1.0 - np.minimum(failed, n) / n
        return out


_DEV_NOISE_ROWS = 13  # per-device normals one window uses (see the g[...] rows in step)
DUTY_CAP = 0.98  # share of a window a serving engine can spend in steps
BASE_ERROR_RATE = 2e-5  # failed requests per request of a healthy serving engine


def poisson_quantile(u: F64, z: F64, mean: F64) -> F64:
    """Poisson(mean) draws: inversion of uniforms `u`, or normals `z` above a mean of 50."""
    out = np.zeros_like(mean)
    small = mean <= 50.0
    if small.any():
        m, uu = mean[small], u[small]
        p = np.exp(-m)
        cdf = p.copy()
        k = np.zeros_like(m)
        todo = uu > cdf
        i = 0
        while todo.any() and i < 200:
            i += 1
            p = p * m / i
            cdf += p
            k += todo
            todo &= uu > cdf
        out[small] = k
    big = ~small
    if big.any():
        out[big] = np.maximum(np.round(mean[big] + np.sqrt(mean[big]) * z[big]), 0.0)
    return out


def full_batch_step(f: Fleet) -> F64:
    """Noise-free step time of every device at its max batch (roofline, collectives, launches)."""
    dev = f.dev
    tok = (dev["max_batch"] * dev["tok_per_seq"])[:, None]
    hit = np.clip(f.sram_hit, 0.0, 0.995)
    bytes_hbm = f.act_bytes_tok * tok + f.weight_bytes + f.reuse_bytes_tok * tok * (1.0 - hit)
    t_comp = (
        f.flops_tok * tok / (dev["peak"] * dev["clock_ratio"])[:, None] / np.minimum(f.eff_c, 0.99)
    )
    t_mem = bytes_hbm / dev["bw"][:, None] / np.minimum(f.eff_m, 0.99)
    t = np.maximum(t_comp, t_mem) + f.kernels * LAUNCH_S
    a = f.allreduce_col
    if a >= 0:
        t_x = (
            dev["comm_tok"] * tok[:, 0] / dev["nvlink"] + dev["comm_step"] / dev["net"]
        ) / LINK_EFF
        t[:, a] = np.where(f.present[:, a], t_x + f.kernels[:, a] * COLLECTIVE_LAT_S, 0.0)
    out: F64 = (t * f.present).sum(axis=1)
    return out


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
        self.var_idx = full.var_idx[idx]
        self.variants = full.variants
        self.device_hw = [full.device_hw[i] for i in idx.tolist()]
        self.host_names = full.host_names
        self.device_names = [full.device_names[i] for i in idx.tolist()]
        self.base_model_idx = full.base_model_idx[idx]
        for name in (
            "flops_tok",
            "weight_bytes",
            "act_bytes_tok",
            "reuse_bytes_tok",
            "kernels",
            "eff_c",
            "eff_m",
            "occupancy",
            "sram_hit",
            "present",
            "kernel_base",
            "kernel_fallback",
            "is_train",
        ):
            setattr(self, name, getattr(full, name)[idx])
        self.pool_present = full.pool_present
        self.dev = {k: v[idx] for k, v in full.dev.items()}
