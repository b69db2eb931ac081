"""Named fault scenarios: fleet, traffic, injected faults, change events and ground truth."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from monitor.arrays import F64
from sim.faults import (
    Contention,
    Cooling,
    Fault,
    IngressDelay,
    KernelFallback,
    KernelSwap,
    MemoryPlacement,
    ModelDeploy,
    ModelSwap,
    NicSlowdown,
    Tiling,
)
from sim.fleet import Fleet, PoolSpec
from sim.physics import NoiseSpec
from sim.traffic import Burst, TrafficSpec, random_bursts
from sim.workloads import LLAMA_8B, WORKLOADS, dense_llm

Level = Literal["pool", "host", "device"]

MILD = NoiseSpec(
    device_sigma=0.015,
    straggler_frac=0.0,
    wander_sigma=0.008,
    white_sigma=0.01,
    outlier_rate=1e-4,
    silence_rate=0.0,
)
REALISTIC = NoiseSpec(silence_rate=3e-4)


class UnknownScenario(KeyError):
    """No scenario of that name."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown scenario {self.name!r} (known: {', '.join(sorted(SCENARIOS))})"


@dataclass(frozen=True, slots=True)
class Change:
    """A change event (contract §2)."""

    ts: float
    id: str
    kind: str
    scope: dict[str, str]
    from_: str
    to: str
    author: str = "ci-bot"

    def to_dict(self) -> dict[str, Any]:
        """The change event as its wire JSON object."""
        return {
            "v": 1,
            "ts": self.ts,
            "id": self.id,
            "kind": self.kind,
            "scope": dict(self.scope),
            "from": self.from_,
            "to": self.to,
            "author": self.author,
            "url": f"https://ci.example/run/{self.id.removeprefix('chg-')}",
        }

    @property
    def key(self) -> bytes:
        """Kafka key: the scope as `k=v` pairs joined by commas."""
        return ",".join(f"{k}={v}" for k, v in self.scope.items()).encode()


@dataclass(slots=True)
class Incident:
    """Ground truth of one injected regression."""

    id: str
    fault: Fault
    pool: str
    level: Level
    layers: list[str]
    indicators: list[tuple[str, str | None]]  # (indicator, layer) pairs that move
    stage: str
    bottleneck: str
    change_id: str | None
    unchanged: list[tuple[str, str | None]] = field(default_factory=list)  # must not move
    settle_windows: int = 1  # windows after onset before the effect is at full size
    condition: str | None = None  # "burst": visible only while the pool is in a burst
    # "overload": lands while the pool's load exceeds its capacity; the backlog, shed
    # requests and queue wait it shows are the overload's, not this incident's
    context: str | None = None
    kernels: dict[str, dict[str, str]] | None = None
    description: str = ""


@dataclass(slots=True)
class Plan:
    """Everything a scenario builds: fleet, noise, faults, changes and incidents."""

    fleet: Fleet
    noise: NoiseSpec
    faults: list[Fault]
    changes: list[Change]
    incidents: list[Incident]
    stream_faults: bool = False
    join_ts: F64 | None = None  # (D,) when each device first reports (-inf: from the start)


class BuildContext:
    """Parameters of one run plus helpers that keep every placement window-aligned and seeded."""

    def __init__(
        self,
        name: str,
        devices: int,
        duration_s: float,
        seed: int,
        window_s: float,
        start_ts: float,
        wide: bool = False,
    ) -> None:
        self.name = name
        self.devices = devices
        self.duration_s = duration_s
        self.seed = seed
        self.w = window_s
        self.start = start_ts
        self.end = start_ts + duration_s
        self.rng = np.random.Generator(np.random.PCG64([seed, 0x5EED]))
        # Wide runs draw their physics per seed from this stream; classic runs never touch
        # it, so their bytes stay what they were.
        self.wide = wide
        self.draw = np.random.Generator(np.random.PCG64([seed, 0x3D1DE]))
        self._ids: set[str] = set()
        self._n_inc = 0

    def at(self, frac: float) -> float:
        """Window boundary nearest to `frac` of the duration."""
        return self.start + round(frac * self.duration_s / self.w) * self.w

    def change(self, kind: str, scope: dict[str, str], from_: str, to: str, ts: float) -> Change:
        """A change event with a fresh seeded id."""
        while True:
            cid = f"chg-{int(self.rng.integers(1000, 100000))}"
            if cid not in self._ids:
                self._ids.add(cid)
                return Change(ts=ts, id=cid, kind=kind, scope=scope, from_=from_, to=to)

    def incident_id(self) -> str:
        """Deterministic incident id."""
        self._n_inc += 1
        return f"{self.name}-{self._n_inc}"

    def bursts(
        self, per_hour: float, avoid: tuple[tuple[float, float], ...] = ()
    ) -> tuple[Burst, ...]:
        """Random burst episodes over the run, clear of `avoid` spans."""
        return random_bursts(self.rng, self.start, self.end, per_hour, self.w, avoid=avoid)

    def uniform(self, lo: float, hi: float) -> float:
        """A per-seed physics draw, uniform on [lo, hi)."""
        return float(self.draw.uniform(lo, hi))

    def log_uniform(self, lo: float, hi: float) -> float:
        """A per-seed physics draw, log-uniform on [lo, hi)."""
        return float(np.exp(self.draw.uniform(np.log(lo), np.log(hi))))

    def noise(self, base: NoiseSpec) -> NoiseSpec:
        """`base`, or in a wide run noise level and shape drawn for this seed."""
        if not self.wide:
            return base
        return NoiseSpec(
            device_sigma=self.log_uniform(0.008, 0.04),
            straggler_frac=self.uniform(0.0, 0.03),
            straggler_factor=self.uniform(0.8, 0.95),
            wander_sigma=self.log_uniform(0.003, 0.02),
            wander_phi=self.uniform(0.8, 0.995),
            white_sigma=self.log_uniform(0.006, 0.035),
            tail=self.uniform(0.0, 1.6),
            outlier_rate=self.log_uniform(3e-5, 8e-4),
            silence_rate=self.log_uniform(1e-4, 1e-3) if base.silence_rate > 0 else 0.0,
            quality_sampling=True,
        )

    def share(self, share: float) -> float:
        """A pool's share of the hosts: `share`, or in a wide run scaled by 0.5-2x."""
        return share * self.log_uniform(0.5, 2.0) if self.wide else share

    def traffic(
        self,
        diurnal: float,
        per_hour: float = 0.0,
        avoid: tuple[tuple[float, float], ...] = (),
        *,
        base_load: float = 0.25,
        steps: tuple[tuple[float, float], ...] = (),
        headroom: tuple[float, float] | None = None,
    ) -> TrafficSpec:
        """A serving pool's load: the arguments, or in a wide run (or with `headroom`, a
        range for capacity / daily peak load) diurnal amplitude, burst rate, size and length,
        capacity headroom and admission queue limit drawn for this seed."""
        if not self.wide and headroom is None:
            bursts = self.bursts(per_hour, avoid=avoid) if per_hour else ()
            return TrafficSpec(diurnal_amp=diurnal, base_load=base_load, bursts=bursts, steps=steps)
        lo = self.uniform(1.2, 1.9)
        mult = (lo, lo + self.uniform(0.2, 1.0))
        minutes = (2.0, self.uniform(4.0, 10.0))
        rate = per_hour * self.log_uniform(0.5, 2.0) if per_hour else 0.0
        bursts = random_bursts(
            self.rng, self.start, self.end, rate, self.w, avoid=avoid, mult=mult, minutes=minutes
        )
        amp = self.uniform(0.05, 0.4) if diurnal else 0.0
        # headroom is drawn over the daily peak; the spec holds it over the mean load
        over_peak = self.log_uniform(*(headroom or (1.4, 3.0)))
        return TrafficSpec(
            diurnal_amp=amp,
            peak_hour_utc=self.uniform(0.0, 24.0),
            bursts=bursts,
            steps=steps,
            headroom=over_peak * (1.0 + amp),
            max_queue_s=self.log_uniform(2.0, 20.0),
        )

    def quiet(self, onset: float, settle: int = 1, span: int = 8) -> tuple[float, float]:
        """The span around an onset that bursts must keep clear of (baseline + effect windows)."""
        return (onset - (span + 2) * self.w, onset + (settle + span + 2) * self.w)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named scenario; `build` turns run parameters into a Plan."""

    name: str
    description: str
    default_devices: int
    default_duration_s: float
    build: Callable[[BuildContext], Plan]
    tests: str = ""
    # "classic": fixed physics unless run wide; "wide": physics drawn per seed, always
    pack: str = "classic"


# --- pools -------------------------------------------------------------------------------


def _train_a(share: float = 1.0) -> PoolSpec:
    return PoolSpec("train-a", "llama-70b/train", "v12", share=share)


def _train_b(share: float = 1.0) -> PoolSpec:
    return PoolSpec("train-b", "llama-8b/train", "v3", share=share)


def _serve_a(traffic: TrafficSpec, share: float = 1.0) -> PoolSpec:
    return PoolSpec(
        "serve-a", "llama-8b/serve", "v3", share=share, traffic=traffic, versions=("v4",)
    )


def _serve_moe(traffic: TrafficSpec, share: float = 1.0) -> PoolSpec:
    return PoolSpec(
        "serve-moe",
        "mixtral-8x7b/serve",
        "v2",
        hw="h200",
        share=share,
        traffic=traffic,
        versions=("v3",),
    )


def _vision(traffic: TrafficSpec, share: float = 1.0) -> PoolSpec:
    return PoolSpec("vision", "resnet-50/serve", "v5", share=share, traffic=traffic)


# --- reusable incident builders --------------------------------------------------------------


def _kernel_fallback(
    ctx: BuildContext, fleet: Fleet, pool: str, frac: float
) -> tuple[Fault, Change, Incident]:
    onset = ctx.at(frac) + ctx.w
    chg = ctx.change("kernel_lib", {"pool": pool}, "2.3.0", "2.4.0", ctx.at(frac) + 0.3 * ctx.w)
    col = fleet.layer_col("attention")
    new_kernel = "flash_attn_v2_compat"
    fault = KernelFallback(
        onset_ts=onset,
        devices=fleet.pool_devices(pool),
        end_ts=None,
        col=col,
        frac=0.4,
        slow=1.45,
        kernel_row=fleet.kernel_id(new_kernel),
    )
    inc = Incident(
        id=ctx.incident_id(),
        fault=fault,
        pool=pool,
        level="pool",
        layers=["attention"],
        indicators=[("fallback_frac", "attention"), ("mfu", "attention")],
        unchanged=[("mfu", "mlp"), ("sram_hit", "attention")],
        stage="lowering",
        bottleneck="kernel_selection",
        change_id=chg.id,
        kernels={
            "attention": {
                "before": fleet.kernel_names[fleet.kernel_base[fault.devices[0], col]],
                "after": new_kernel,
            }
        },
        description="kernel_lib 2.4.0 selects a compat attention kernel; 40% of attention ops "
        "fall back to a slower path",
    )
    return fault, chg, inc


def _tiling(
    ctx: BuildContext, fleet: Fleet, pool: str, frac: float
) -> tuple[Fault, Change, Incident]:
    onset = ctx.at(frac) + ctx.w
    chg = ctx.change(
        "compiler", {"pool": pool}, "xla-2026.03", "xla-2026.04", ctx.at(frac) + 0.5 * ctx.w
    )
    fault = Tiling(
        onset_ts=onset, devices=fleet.pool_devices(pool), end_ts=None, col=fleet.layer_col("mlp")
    )
    inc = Incident(
        id=ctx.incident_id(),
        fault=fault,
        pool=pool,
        level="pool",
        layers=["mlp"],
        indicators=[
            ("sram_hit", "mlp"),
            ("intensity", "mlp"),
            ("occupancy", "mlp"),
            ("mfu", "mlp"),
            ("stall_frac", "mlp"),
        ],
        unchanged=[("fallback_frac", "mlp"), ("mfu", "attention")],
        stage="scheduling",
        bottleneck="tiling",
        change_id=chg.id,
        description="the new compiler halves the MLP GEMM tile: weight panels are re-read twice "
        "as often and miss SRAM more, the GEMM turns memory-bound",
    )
    return fault, chg, inc


def _placement(
    ctx: BuildContext, fleet: Fleet, pool: str, frac: float
) -> tuple[Fault, Change, Incident]:
    onset = ctx.at(frac) + ctx.w
    chg = ctx.change(
        "scheduler_config",
        {"pool": pool},
        "kv-placement=sram-first",
        "kv-placement=hbm",
        ctx.at(frac) + 0.5 * ctx.w,
    )
    fault = MemoryPlacement(
        onset_ts=onset,
        devices=fleet.pool_devices(pool),
        end_ts=None,
        col=fleet.layer_col("attention"),
        spill_frac=0.4,
        hit_scale=0.8,
    )
    inc = Incident(
        id=ctx.incident_id(),
        fault=fault,
        pool=pool,
        level="pool",
        layers=["attention"],
        indicators=[
            ("spill_bytes", "attention"),
            ("sram_hit", "attention"),
            ("intensity", "attention"),
            ("mfu", "attention"),
        ],
        unchanged=[("fallback_frac", "attention"), ("mfu", "mlp")],
        stage="scheduling",
        bottleneck="memory_placement",
        change_id=chg.id,
        description="a scheduler config places attention scratch buffers in HBM: spill traffic, "
        "lower SRAM hit rate, the memory-bound decode attention slows",
    )
    return fault, chg, inc


def _sync(
    ctx: BuildContext, fleet: Fleet, pool: str, frac: float, factor: float = 4.0
) -> tuple[Fault, Incident]:
    onset = ctx.at(frac)
    hosts = fleet.pool_hosts(pool)
    host = int(hosts[int(ctx.rng.integers(0, len(hosts)))])
    fault = Contention(onset_ts=onset, devices=fleet.host_devices(host), end_ts=None, factor=factor)
    inc = Incident(
        id=ctx.incident_id(),
        fault=fault,
        pool=pool,
        level="host",
        layers=["allreduce"],
        indicators=[("sync_frac", "allreduce"), ("mfu", "allreduce"), ("device_mfu", None)],
        unchanged=[("mfu", "mlp"), ("mfu", "attention"), ("sram_hit", "allreduce")],
        stage="execution",
        bottleneck="sync",
        change_id=None,
        description=f"link contention on one host: its all-reduces wait {factor - 1:g}x their "
        "transfer time",
    )
    return fault, inc


def _thermal(
    ctx: BuildContext, fleet: Fleet, pool: str, frac: float, n: int = 3, factor: float = 4.0
) -> tuple[Fault, Incident]:
    onset = ctx.at(frac)
    devs = fleet.pool_devices(pool)
    pick = np.sort(ctx.rng.choice(devs, size=min(n, len(devs)), replace=False)).astype(np.int64)
    fault = Cooling(onset_ts=onset, devices=pick, end_ts=None, factor=factor)
    gemm = "conv" if fleet.pools[fleet.pool_id(pool)].workload.startswith("resnet") else "mlp"
    inc = Incident(
        id=ctx.incident_id(),
        fault=fault,
        pool=pool,
        level="device",
        layers=[gemm],
        indicators=[("temp_c", None), ("clock_mhz", None), ("mfu", gemm)],
        unchanged=[("sram_hit", gemm), ("fallback_frac", gemm)],
        stage="execution",
        bottleneck="thermal",
        change_id=None,
        settle_windows=12,
        description="cooling degrades on a few devices: temperature climbs past the throttle "
        "point, the clock steps down and compute-bound layers lose FLOP/s",
    )
    return fault, inc


def _ingress(
    ctx: BuildContext, fleet: Fleet, pool: str, frac: float
) -> tuple[Fault, Change, Incident]:
    onset = ctx.at(frac) + ctx.w
    chg = ctx.change(
        "traffic_policy",
        {"pool": pool},
        "admission=token-bucket(2000/s)",
        "admission=token-bucket(400/s)",
        ctx.at(frac) + 0.5 * ctx.w,
    )
    fault = IngressDelay(
        onset_ts=onset, devices=fleet.pool_devices(pool), end_ts=None, delay_ms=250.0
    )
    inc = Incident(
        id=ctx.incident_id(),
        fault=fault,
        pool=pool,
        level="pool",
        layers=[],
        indicators=[("queue_wait_ms", None), ("queue_depth", None), ("lat_p99_ms", None)],
        unchanged=[("mfu", "attention"), ("mfu", "mlp"), ("batch", None)],
        stage="ingress",
        bottleneck="admission_queueing",
        change_id=chg.id,
        description="a tighter router admission policy queues requests before batching: queue "
        "and p99 rise, the accelerators are unaffected",
    )
    return fault, chg, inc


def _quality(
    ctx: BuildContext,
    fleet: Fleet,
    pool: str,
    frac: float,
    delta: float = -0.04,
    error_rate: float = 0.0,
) -> tuple[Fault, Change, Incident]:
    onset = ctx.at(frac) + ctx.w
    p = fleet.pools[fleet.pool_id(pool)]
    new = p.versions[0]
    chg = ctx.change(
        "model",
        {"pool": pool},
        p.model,
        f"{p.model.split('@')[0]}@{new}",
        ctx.at(frac) + 0.5 * ctx.w,
    )
    fault = ModelDeploy(
        onset_ts=onset,
        devices=fleet.pool_devices(pool),
        end_ts=None,
        model_row=fleet.model_row[(fleet.pool_id(pool), new)],
        quality_delta=delta,
        error_rate=error_rate,
    )
    inc = Incident(
        id=ctx.incident_id(),
        fault=fault,
        pool=pool,
        level="pool",
        layers=[],
        indicators=[("quality", None)],
        unchanged=[("mfu", "attention"), ("mfu", "mlp"), ("lat_p99_ms", None), ("batch", None)],
        stage="validation",
        bottleneck="model_quality",
        change_id=chg.id,
        description="a new model version with the same shapes scores lower in validation; the "
        "hardware metrics do not move",
    )
    return fault, chg, inc


# --- scenarios ---------------------------------------------------------------------------------


def _pool_regression(ctx: BuildContext) -> Plan:
    fleet = Fleet([_train_a(ctx.share(1.0)), _train_b()], ctx.devices)
    fault, chg, inc = _kernel_fallback(ctx, fleet, "train-a", 0.4)
    return Plan(fleet, ctx.noise(MILD), [fault], [chg], [inc])


def _dirty_stream(ctx: BuildContext) -> Plan:
    plan = _pool_regression(ctx)
    plan.stream_faults = True
    return plan


def _kernel_fallback_sc(ctx: BuildContext) -> Plan:
    fleet_pools = [_train_a(ctx.share(2.0)), _train_b(), _serve_a(ctx.traffic(0.25))]
    fleet = Fleet(fleet_pools, ctx.devices)
    fault, chg, inc = _kernel_fallback(ctx, fleet, "train-a", 0.5)
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg], [inc])


def _tiling_sc(ctx: BuildContext) -> Plan:
    fleet = Fleet([_train_a(ctx.share(1.0)), _train_b()], ctx.devices)
    fault, chg, inc = _tiling(ctx, fleet, "train-b", 0.5)
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg], [inc])


def _placement_sc(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.5) + ctx.w
    traffic = ctx.traffic(0.25, 2.0, (ctx.quiet(onset),))
    fleet = Fleet([_serve_a(traffic, ctx.share(2.0)), _train_a()], ctx.devices)
    fault, chg, inc = _placement(ctx, fleet, "serve-a", 0.5)
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg], [inc])


def _sync_sc(ctx: BuildContext) -> Plan:
    fleet = Fleet([_train_a(ctx.share(2.0)), _train_b()], ctx.devices)
    fault, inc = _sync(ctx, fleet, "train-a", 0.5)
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [], [inc])


def _thermal_sc(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.4)
    traffic = ctx.traffic(0.2, 1.0, (ctx.quiet(onset, 12),), base_load=0.4)
    fleet = Fleet([_vision(traffic, ctx.share(2.0)), _train_a()], ctx.devices)
    fault, inc = _thermal(ctx, fleet, "vision", 0.4)
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [], [inc])


def _burst_only(ctx: BuildContext) -> Plan:
    w = ctx.w

    def burst(frac: float) -> Burst:
        s = ctx.at(frac)
        return Burst(s, s + round(240.0 / w) * w, 2.5)

    bursts = (burst(0.12), burst(0.3), burst(0.62), burst(0.82))
    # the token threshold below needs the classic load: only the noise is drawn per seed
    fleet = Fleet([_serve_a(TrafficSpec(bursts=bursts), ctx.share(2.0)), _train_b()], ctx.devices)
    t_chg = ctx.at(0.45) + 0.5 * w
    chg = ctx.change("compiler", {"pool": "serve-a"}, "triton-3.4", "triton-3.5", t_chg)
    # steps of a normal load carry ~270 tokens, a 2.5x burst ~670: only bursts cross 450
    fault = Tiling(
        onset_ts=ctx.at(0.45) + w,
        devices=fleet.pool_devices("serve-a"),
        end_ts=None,
        col=fleet.layer_col("mlp"),
        min_tokens=450.0,
        hit_scale=0.8,
        occ_scale=0.8,
        eff_scale=0.95,
    )
    inc = Incident(
        id=ctx.incident_id(),
        fault=fault,
        pool="serve-a",
        level="pool",
        layers=["mlp"],
        indicators=[("sram_hit", "mlp"), ("intensity", "mlp"), ("mfu", "mlp")],
        unchanged=[("fallback_frac", "mlp"), ("mfu", "attention")],
        stage="scheduling",
        bottleneck="tiling",
        change_id=chg.id,
        condition="burst",
        description="the new compiler picks a bad tile only for large GEMMs; MLP MFU falls only "
        "while bursts push the batch above the threshold",
    )
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg], [inc])


def _ingress_sc(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.5) + ctx.w
    tr = ctx.traffic(0.25, 1.5, (ctx.quiet(onset),))
    fleet = Fleet([_serve_a(tr, ctx.share(2.0)), _serve_moe(ctx.traffic(0.25))], ctx.devices)
    fault, chg, inc = _ingress(ctx, fleet, "serve-a", 0.5)
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg], [inc])


def _quality_sc(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.5) + ctx.w
    tr = ctx.traffic(0.25, 1.5, (ctx.quiet(onset),))
    fleet = Fleet([_serve_a(tr, ctx.share(2.0)), _train_b()], ctx.devices)
    fault, chg, inc = _quality(ctx, fleet, "serve-a", 0.5)
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg], [inc])


def _healthy(ctx: BuildContext) -> Plan:
    tr_a = ctx.traffic(0.3, 3.0)
    tr_m = ctx.traffic(0.3, 3.0)
    fleet = Fleet([_serve_a(tr_a, ctx.share(2.0)), _serve_moe(tr_m), _train_a()], ctx.devices)
    chg = ctx.change("driver", {"pool": "serve-moe"}, "550.90.07", "550.127.05", ctx.at(0.5) + 3.0)
    return Plan(fleet, ctx.noise(REALISTIC), [], [chg], [])


def _deploys(ctx: BuildContext) -> Plan:
    w = ctx.w
    t_traffic = ctx.at(0.75)
    tr = ctx.traffic(0.25, 2.0, steps=((t_traffic, 1.3),))
    fleet = Fleet([_train_a(ctx.share(1.0)), _serve_a(tr, 2.0)], ctx.devices)
    k_new = fleet.kernel_id("flash_attn_v3_1")
    c1 = ctx.change("kernel_lib", {"pool": "train-a"}, "2.3.0", "2.3.1", ctx.at(0.3) + 0.5 * w)
    f1 = KernelSwap(
        onset_ts=ctx.at(0.3) + w,
        devices=fleet.pool_devices("train-a"),
        end_ts=None,
        col=fleet.layer_col("attention"),
        kernel_row=k_new,
    )
    c2 = ctx.change("driver", {"pool": "serve-a"}, "550.90.07", "550.127.05", ctx.at(0.45) + 2.0)
    c3 = ctx.change(
        "model", {"pool": "serve-a"}, "llama-8b@v3", "llama-8b@v4", ctx.at(0.6) + 0.5 * w
    )
    f3 = ModelDeploy(
        onset_ts=ctx.at(0.6) + w,
        devices=fleet.pool_devices("serve-a"),
        end_ts=None,
        model_row=fleet.model_row[(fleet.pool_id("serve-a"), "v4")],
    )
    c4 = ctx.change(
        "traffic_policy", {"pool": "serve-a"}, "weight=1.0", "weight=1.3", t_traffic - 0.5 * w
    )
    return Plan(fleet, ctx.noise(REALISTIC), [f1, f3], [c1, c2, c3, c4], [])


def _fleet_day(ctx: BuildContext) -> Plan:
    w = ctx.w
    fracs = {"kernel": 0.12, "thermal": 0.28, "placement": 0.44, "ingress": 0.6, "sync": 0.76}
    quiet = tuple(ctx.quiet(ctx.at(f) + w, 12) for f in fracs.values())
    serve_tr = ctx.traffic(0.3, 1.0, quiet)
    moe_tr = ctx.traffic(0.3, 1.0, quiet)
    vis_tr = ctx.traffic(0.2, 0.5, quiet, base_load=0.4)
    fleet = Fleet(
        [
            _train_a(ctx.share(3.0)),
            _train_b(ctx.share(2.0)),
            _serve_a(serve_tr, ctx.share(2.0)),
            _serve_moe(moe_tr),
            _vision(vis_tr),
        ],
        ctx.devices,
    )
    faults: list[Fault] = []
    changes: list[Change] = []
    incidents: list[Incident] = []
    f, c, i = _kernel_fallback(ctx, fleet, "train-a", fracs["kernel"])
    # rolled back an hour later (or at 90% of a short run)
    end = min(f.onset_ts + round(3600.0 / w) * w, ctx.at(0.9))
    f.end_ts = end
    changes.append(ctx.change("kernel_lib", {"pool": "train-a"}, "2.4.0", "2.3.0", end - 0.5 * w))
    faults.append(f)
    changes.append(c)
    incidents.append(i)
    f2, i2 = _thermal(ctx, fleet, "vision", fracs["thermal"])
    f3, c3, i3 = _placement(ctx, fleet, "serve-a", fracs["placement"])
    f4, c4, i4 = _ingress(ctx, fleet, "serve-moe", fracs["ingress"])
    # train-b's gradient all-reduce is short next to its step, so its NIC must degrade badly
    f5, i5 = _sync(ctx, fleet, "train-b", fracs["sync"], factor=12.0)
    faults += [f2, f3, f4, f5]
    changes += [c3, c4]
    incidents += [i2, i3, i4, i5]
    changes.append(
        ctx.change("driver", {"pool": "train-b"}, "550.90.07", "550.127.05", ctx.at(0.2) + 1.0)
    )
    changes.sort(key=lambda ch: ch.ts)
    return Plan(fleet, ctx.noise(REALISTIC), faults, changes, incidents)


# --- the wide pack: physics drawn per seed, overload, small scopes, mixed hardware ------------


def _serve_mix(ctx: BuildContext, traffic: TrafficSpec, share: float = 1.0) -> PoolSpec:
    """A llama-8b serving pool on a mix of A100 and H100 hosts."""
    a100 = ctx.uniform(0.25, 0.75)
    return PoolSpec(
        "serve-mix",
        "llama-8b/serve",
        "v7",
        share=share,
        traffic=traffic,
        hw_mix=(("h100-sxm", 1.0 - a100), ("a100-sxm", a100)),
    )


def _overload(ctx: BuildContext, tr: TrafficSpec, lo: float, hi: float) -> TrafficSpec:
    """`tr` plus one burst, at a random point of [lo, hi] of the run, that exceeds capacity."""
    w = ctx.w
    head = tr.headroom or 1.0
    s = ctx.at(ctx.uniform(lo, hi))
    e = s + round(ctx.uniform(4.0, 10.0) * 60.0 / w) * w
    b = Burst(s, e, head * ctx.uniform(1.15, 1.6) / tr.load(s))
    kept = tuple(x for x in tr.bursts if x.end + 2 * w < s or x.start - 2 * w > e)
    return replace(tr, bursts=tuple(sorted((*kept, b), key=lambda x: x.start)))


def _joins(ctx: BuildContext, fleet: Fleet, pool: str, share: float, frac: float) -> F64:
    """Join times: `share` of the pool's hosts (at least one) first report at `frac` of the run."""
    hosts = fleet.pool_hosts(pool)
    k = max(1, round(share * len(hosts))) if len(hosts) > 1 else 0
    late = ctx.rng.choice(hosts, size=k, replace=False)
    out = np.full(fleet.n, -np.inf)
    out[np.isin(fleet.host_idx, late)] = ctx.at(frac)
    return out


def _overload_bursts(ctx: BuildContext) -> Plan:
    serve = _overload(ctx, ctx.traffic(0.3, 3.0, headroom=(1.15, 1.7)), 0.15, 0.45)
    mix = _overload(ctx, ctx.traffic(0.3, 3.0, headroom=(1.15, 1.7)), 0.5, 0.8)
    fleet = Fleet(
        [_serve_a(serve, ctx.share(2.0)), _serve_mix(ctx, mix, ctx.share(1.5)), _train_a()],
        ctx.devices,
    )
    t = ctx.at(ctx.uniform(0.3, 0.7)) + 3.0
    chg = ctx.change("driver", {"pool": "serve-a"}, "550.90.07", "550.127.05", t)
    return Plan(fleet, ctx.noise(REALISTIC), [], [chg], [])


def _nic_slowdown(ctx: BuildContext) -> Plan:
    serve = ctx.traffic(0.25, 2.0, headroom=(1.2, 2.0))
    fleet = Fleet(
        [_train_a(ctx.share(2.0)), _train_b(), _serve_a(serve, ctx.share(1.0))], ctx.devices
    )
    hosts = fleet.pool_hosts("train-a")
    host = int(hosts[int(ctx.rng.integers(0, len(hosts)))])
    factor = ctx.uniform(2.0, 3.0)
    fault = NicSlowdown(
        onset_ts=ctx.at(0.5), devices=fleet.host_devices(host), end_ts=None, factor=factor
    )
    inc = Incident(
        id=ctx.incident_id(),
        fault=fault,
        pool="train-a",
        level="host",
        layers=["allreduce"],
        indicators=[("sync_frac", "allreduce"), ("device_mfu", None)],
        unchanged=[("mfu", "mlp"), ("mfu", "attention"), ("sram_hit", "allreduce")],
        stage="execution",
        bottleneck="sync",
        change_id=None,
        description=f"a degraded NIC on one host: its all-reduces wait {factor:.2f}x as long; "
        "step time up, device MFU down a few percent; no change event (drain the host)",
    )
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [], [inc])


def _error_rise(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.5) + ctx.w
    tr = ctx.traffic(0.25, 1.5, (ctx.quiet(onset),), headroom=(1.4, 2.5))
    serve = _serve_a(tr, ctx.share(2.0))
    mix = ctx.traffic(0.25, 1.5, headroom=(1.4, 2.5))
    fleet = Fleet([serve, _serve_mix(ctx, mix), _train_b()], ctx.devices)
    rate = ctx.log_uniform(0.003, 0.02) if ctx.wide else 0.005
    fault, chg, inc = _quality(ctx, fleet, "serve-a", 0.5, delta=0.0, error_rate=rate)
    inc.indicators = [("error_rate", None)]
    inc.unchanged = [("mfu", "attention"), ("mfu", "mlp"), ("lat_p99_ms", None), ("quality", None)]
    inc.bottleneck = "errors"
    inc.description = (
        f"a model deploy fails {100 * rate:.2g}% of requests outright (from 0.002%); answers "
        "that succeed are as good as before, hardware metrics and latency do not move"
    )
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg], [inc])


def _quality_drop(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.5) + ctx.w
    tr = ctx.traffic(0.25, 1.5, (ctx.quiet(onset),), headroom=(1.4, 2.5))
    serve = replace(_serve_a(tr, ctx.share(2.0)), quality=0.999)
    mix = ctx.traffic(0.25, 1.5, headroom=(1.4, 2.5))
    fleet = Fleet([serve, _serve_mix(ctx, mix), _train_b()], ctx.devices)
    fault, chg, inc = _quality(ctx, fleet, "serve-a", 0.5, delta=-0.009)
    inc.description = (
        "a model deploy answers 1% of requests wrongly instead of 0.1%: quality 0.999 -> 0.990, "
        "a tenfold error rate; hardware metrics and latency do not move"
    )
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg], [inc])


def _thermal_small(ctx: BuildContext) -> Plan:
    serve = ctx.traffic(0.25, 2.0, headroom=(1.3, 2.5))
    fleet = Fleet([_train_a(ctx.share(2.0)), _serve_a(serve, ctx.share(1.0))], ctx.devices)
    n = int(ctx.draw.integers(1, 3))
    fault, inc = _thermal(ctx, fleet, "train-a", 0.4, n=n, factor=ctx.uniform(2.0, 2.4))
    inc.description = (
        f"cooling degrades on {n} training device(s): a few degrees over the throttle point, "
        "clock and MLP MFU down ~10-20%; host peers wait for them; no change event"
    )
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [], [inc])


def _fallback_in_overload(ctx: BuildContext) -> Plan:
    tr = ctx.traffic(0.2, headroom=(1.1, 1.4))
    head = tr.headroom or 1.0
    burst = Burst(ctx.at(0.3), ctx.at(0.8), head * ctx.uniform(1.3, 1.8) / tr.load(ctx.at(0.55)))
    tr = replace(tr, bursts=(burst,))
    moe = ctx.traffic(0.25, 2.0, headroom=(1.3, 2.5))
    fleet = Fleet(
        [_serve_a(tr, ctx.share(2.0)), _serve_moe(moe), _train_b(ctx.share(1.0))], ctx.devices
    )
    fault, chg, inc = _kernel_fallback(ctx, fleet, "serve-a", 0.55)
    inc.context = "overload"
    inc.description = (
        "kernel_lib 2.4.0 on serve-a while a burst holds the pool above capacity (batch at its "
        "cap, backlog at the admission limit, requests shed): attention falls back to a slower "
        "kernel; a separate incident from the overload, rollback to the kernel_lib change"
    )
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg], [inc])


def _swap_to_long_context(
    ctx: BuildContext, fleet: Fleet, pool: str, frac: float
) -> tuple[Fault, Change]:
    """A `model` change to a long-context version (prompt 512 -> 2048): attention costs more
    per token; quality equal. A deliberate workload change, not a regression."""
    p = fleet.pools[fleet.pool_id(pool)]
    old = WORKLOADS[p.workload]
    new = dense_llm("llama-8b", mode="serve", prompt=2048, gen=256, max_batch=256, **LLAMA_8B)
    ratios = {k: np.ones(len(fleet.layers)) for k in ("flops_tok", "act_bytes_tok", "weight_bytes")}
    for j, lt in enumerate(fleet.layers):
        if lt in old.layers and lt in new.layers:
            for k, arr in ratios.items():
                a, b = getattr(old.layers[lt], k), getattr(new.layers[lt], k)
                arr[j] = b / a if a else 1.0
    ver = p.versions[-1]
    t = ctx.at(frac)
    chg = ctx.change("model", {"pool": pool}, p.model, f"llama-8b@{ver}", t + 0.5 * ctx.w)
    fault = ModelSwap(
        onset_ts=t + ctx.w,
        devices=fleet.pool_devices(pool),
        end_ts=None,
        model_row=fleet.model_row[(fleet.pool_id(pool), ver)],
        flops=ratios["flops_tok"],
        bytes_=ratios["act_bytes_tok"],
        weights=ratios["weight_bytes"],
    )
    return fault, chg


def _model_swap(ctx: BuildContext) -> Plan:
    tr = ctx.traffic(0.25, 2.0, headroom=(1.6, 3.0))
    serve = replace(_serve_a(tr, ctx.share(2.0)), versions=("v5",))
    fleet = Fleet([serve, _train_a(ctx.share(1.0))], ctx.devices)
    fault, chg = _swap_to_long_context(ctx, fleet, "serve-a", ctx.uniform(0.35, 0.6))
    drv = ctx.change("driver", {"pool": "train-a"}, "550.90.07", "550.127.05", ctx.at(0.3) + 2.0)
    return Plan(fleet, ctx.noise(REALISTIC), [fault], [chg, drv], [])


def _mixed_joins(ctx: BuildContext) -> Plan:
    tr = _overload(ctx, ctx.traffic(0.3, 2.0, headroom=(1.2, 2.5)), 0.1, 0.3)
    fleet = Fleet([_serve_mix(ctx, tr, ctx.share(2.0)), _train_b(ctx.share(1.0))], ctx.devices)
    join = _joins(ctx, fleet, "serve-mix", ctx.uniform(0.2, 0.5), ctx.uniform(0.35, 0.5))
    late_train = _joins(ctx, fleet, "train-b", 0.2, ctx.uniform(0.55, 0.75))
    chg = ctx.change("driver", {"pool": "serve-mix"}, "550.90.07", "550.127.05", ctx.at(0.8) + 2.0)
    return Plan(fleet, ctx.noise(REALISTIC), [], [chg], [], join_ts=np.maximum(join, late_train))


def _healthy_fleet(ctx: BuildContext) -> Plan:
    """Hours of a large healthy fleet: overload bursts, deploys, a model swap, mixed hardware,
    hosts joining; nothing in it is a regression."""
    w = ctx.w
    fleet = Fleet(
        [
            _train_a(ctx.share(3.0)),
            _train_b(ctx.share(1.5)),
            replace(
                _serve_a(ctx.traffic(0.3, 3.0, headroom=(1.15, 2.0)), ctx.share(2.0)),
                versions=("v4", "v5"),
            ),
            _serve_mix(ctx, ctx.traffic(0.3, 3.0, headroom=(1.15, 2.0)), ctx.share(2.0)),
            _serve_moe(ctx.traffic(0.3, 2.0, headroom=(1.3, 2.5)), ctx.share(1.0)),
            _vision(
                ctx.traffic(0.2, 1.0, steps=((ctx.at(0.8), 1.2),), headroom=(1.6, 2.5)),
                ctx.share(1.0),
            ),
        ],
        ctx.devices,
    )
    k_new = fleet.kernel_id("flash_attn_v3_1")
    patch = KernelSwap(
        onset_ts=ctx.at(0.2) + w,
        devices=fleet.pool_devices("train-a"),
        end_ts=None,
        col=fleet.layer_col("attention"),
        kernel_row=k_new,
    )
    swap, c_swap = _swap_to_long_context(ctx, fleet, "serve-a", 0.55)
    moe_v3 = ModelDeploy(
        onset_ts=ctx.at(0.7) + w,
        devices=fleet.pool_devices("serve-moe"),
        end_ts=None,
        model_row=fleet.model_row[(fleet.pool_id("serve-moe"), "v3")],
    )
    changes = [
        ctx.change("kernel_lib", {"pool": "train-a"}, "2.3.0", "2.3.1", ctx.at(0.2) + 0.5 * w),
        ctx.change("driver", {"pool": "serve-mix"}, "550.90.07", "550.127.05", ctx.at(0.3) + 2.0),
        c_swap,
        ctx.change(
            "model",
            {"pool": "serve-moe"},
            "mixtral-8x7b@v2",
            "mixtral-8x7b@v3",
            ctx.at(0.7) + 0.5 * w,
        ),
        ctx.change(
            "traffic_policy", {"pool": "vision"}, "weight=1.0", "weight=1.2", ctx.at(0.8) - 0.5 * w
        ),
    ]
    join = np.maximum(
        _joins(ctx, fleet, "serve-mix", 0.25, 0.4), _joins(ctx, fleet, "train-b", 0.1, 0.6)
    )
    plan = Plan(fleet, ctx.noise(REALISTIC), [patch, swap, moe_v3], changes, [], join_ts=join)
    plan.changes.sort(key=lambda ch: ch.ts)
    return plan


_WIDE = [
    Scenario(
        "overload_bursts",
        "two serving pools (one mixing A100 and H100 hosts) with little headroom: bursts "
        "exceed capacity, the batch pins at its cap, a backlog builds, admission sheds; healthy",
        256,
        3600.0,
        _overload_bursts,
        "false positives under overload: queueing grows like rho/(1-rho) and backlog carries "
        "over windows; per-layer efficiency at that load is unchanged, nothing must page",
        pack="wide",
    ),
    Scenario(
        "nic_slowdown",
        "one train-a host's NIC degrades: its all-reduce sync wait x2-3, device MFU down a few "
        "percent; no change event",
        256,
        1800.0,
        _nic_slowdown,
        "a collective slowdown at host scope: sync fraction, not allreduce MFU; stage "
        "execution, no rollback",
        pack="wide",
    ),
    Scenario(
        "quality_drop",
        "model deploy on serve-a: quality 0.999 -> 0.990 (error rate x10); nothing else moves",
        256,
        1800.0,
        _quality_drop,
        "quality near 1 judged on its error rate: stage validation, rollback to the model deploy",
        pack="wide",
    ),
    Scenario(
        "error_rise",
        "model deploy on serve-a: 0.3-2% of requests fail (from 0.002%); quality of the "
        "answers, latency and MFU do not move",
        256,
        1800.0,
        _error_rise,
        "failed requests judged per request: stage validation, rollback to the model deploy",
        pack="wide",
    ),
    Scenario(
        "thermal_small",
        "cooling degrades on 1-2 train-a devices: a mild throttle (clock and MLP MFU -10-20%); "
        "no change event",
        256,
        1800.0,
        _thermal_small,
        "a device-scope hardware fault corroborated by clock, temperature and MFU, whatever "
        "the share of the pool",
        pack="wide",
    ),
    Scenario(
        "fallback_in_overload",
        "kernel_lib change on serve-a while a long burst holds it above capacity: attention "
        "falls back to a slower kernel",
        256,
        1800.0,
        _fallback_in_overload,
        "distinct mechanisms stay distinct: its own incident, stage lowering, rollback to the "
        "kernel_lib change, not merged into the overload",
        pack="wide",
    ),
    Scenario(
        "model_swap",
        "model change on serve-a to a long-context version (prompt 512 -> 2048): attention "
        "MFU and step time shift, quality equal; healthy",
        256,
        3600.0,
        _model_swap,
        "a deliberate workload change with its change event is a new baseline, not a "
        "regression: nothing must page",
        pack="wide",
    ),
    Scenario(
        "mixed_joins",
        "a serving pool mixing A100 and H100 hosts, an overload burst, hosts joining it and a "
        "training pool mid-run (per-device load drops when they join); healthy",
        256,
        3600.0,
        _mixed_joins,
        "false positives from mixed hardware, scale-out and overload: nothing must page",
        pack="wide",
    ),
    Scenario(
        "healthy_fleet",
        "six pools over hours: overload bursts, kernel, driver, model and traffic-policy "
        "changes, a model swap, mixed hardware, hosts joining; no incidents",
        1024,
        6 * 3600.0,
        _healthy_fleet,
        "the false-page budget on a long healthy fleet (bench.diagnose --healthy-fleet)",
        pack="wide",
    ),
]

_SCENARIOS = [
    Scenario(
        "pool_regression",
        "attention MFU -15% on every train-a device one window after a kernel_lib change (mild "
        "noise, no bursts)",
        256,
        1200.0,
        _pool_regression,
        "the basic end-to-end path: one pool-wide lowering regression with its change event",
    ),
    Scenario(
        "kernel_fallback",
        "kernel_lib change on train-a: attention kernel variant changes, fallback share 0 -> 0.4, "
        "attention MFU -15%",
        256,
        1800.0,
        _kernel_fallback_sc,
        "lowering attribution (kernel + fallback_frac move before MFU) and rollback to the change",
    ),
    Scenario(
        "tiling_regression",
        "compiler change on train-b halves the MLP tile: SRAM hit, occupancy and MLP MFU fall",
        256,
        1800.0,
        _tiling_sc,
        "scheduling attribution: SRAM hit / intensity move while kernels and fallback do not",
    ),
    Scenario(
        "memory_placement",
        "scheduler_config change on serve-a spills attention buffers to HBM: spill bytes up, "
        "attention MFU down",
        256,
        1800.0,
        _placement_sc,
        "scheduling attribution on a memory-bound layer, with serving traffic and bursts around",
    ),
    Scenario(
        "sync_contention",
        "one train-a host's all-reduces stall on link contention; no change event",
        256,
        1800.0,
        _sync_sc,
        "host-level scope and execution/sync attribution without any change to roll back",
    ),
    Scenario(
        "thermal_throttle",
        "cooling fails on 3 vision devices: temperature up, clock down, conv MFU down",
        256,
        1800.0,
        _thermal_sc,
        "device-level scope, a gradual onset, and device_stats evidence for execution/thermal",
    ),
    Scenario(
        "burst_only_regression",
        "compiler change on serve-a makes large-batch MLP tiles bad: visible only during bursts",
        256,
        3600.0,
        _burst_only,
        "load-conditioned detection: the regression exists only in burst windows",
    ),
    Scenario(
        "ingress_queueing",
        "admission policy change on serve-a: queue wait, queue depth and p99 rise; MFU does not",
        256,
        1800.0,
        _ingress_sc,
        "ingress attribution: the most upstream stage, with hardware metrics flat",
    ),
    Scenario(
        "quality_regression",
        "model change on serve-a (v3 -> v4): validation quality drops; MFU and latency do not",
        256,
        1800.0,
        _quality_sc,
        "validation attribution: only slo.quality moves, after a model change event",
    ),
    Scenario(
        "healthy_with_bursts",
        "diurnal load, burst episodes and a harmless driver deploy; no incidents",
        256,
        3600.0,
        _healthy,
        "false positives: bursts raise batch and MFU of healthy devices; nothing must fire",
    ),
    Scenario(
        "deploy_without_regression",
        "kernel_lib, driver and model deploys plus a +30% traffic shift; no incidents",
        256,
        3600.0,
        _deploys,
        "false positives: change events and a kernel-name change with no performance effect",
    ),
    Scenario(
        "fleet_day",
        "five pools over hours: kernel fallback (rolled back), thermal, memory placement, ingress "
        "queueing and sync contention on different pools",
        512,
        6 * 3600.0,
        _fleet_day,
        "several concurrent incidents with distinct scopes, stages and changes, plus bursts",
    ),
    Scenario(
        "dirty_stream",
        "pool_regression plus duplicates, late records, host gaps and malformed lines",
        256,
        1200.0,
        _dirty_stream,
        "decoder robustness: dead-letter reasons, dedup and late-record handling",
    ),
]
SCENARIOS: dict[str, Scenario] = {s.name: s for s in [*_SCENARIOS, *_WIDE]}


def get(name: str) -> Scenario:
    """The scenario called `name`; raises UnknownScenario."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise UnknownScenario(name) from None
