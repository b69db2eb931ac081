"""Named fault scenarios: fleet, traffic, injected faults, change events and ground truth."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from sim.faults import (
    Contention,
    Cooling,
    Fault,
    IngressDelay,
    KernelFallback,
    KernelSwap,
    MemoryPlacement,
    ModelDeploy,
    Tiling,
)
from sim.fleet import Fleet, PoolSpec
from sim.physics import NoiseSpec
from sim.traffic import Burst, TrafficSpec, random_bursts

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
    ) -> None:
        self.name = name
        self.devices = devices
        self.duration_s = duration_s
        self.seed = seed
        self.w = window_s
        self.start = start_ts
        self.end = start_ts + duration_s
        self.rng = np.random.Generator(np.random.PCG64([seed, 0x5EED]))
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
    ctx: BuildContext, fleet: Fleet, pool: str, frac: float, n: int = 3
) -> tuple[Fault, Incident]:
    onset = ctx.at(frac)
    devs = fleet.pool_devices(pool)
    pick = np.sort(ctx.rng.choice(devs, size=min(n, len(devs)), replace=False)).astype(np.int64)
    fault = Cooling(onset_ts=onset, devices=pick, end_ts=None, factor=4.0)
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
    ctx: BuildContext, fleet: Fleet, pool: str, frac: float
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
        quality_delta=-0.04,
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
    fleet = Fleet([_train_a(), _train_b()], ctx.devices)
    fault, chg, inc = _kernel_fallback(ctx, fleet, "train-a", 0.4)
    return Plan(fleet, MILD, [fault], [chg], [inc])


def _dirty_stream(ctx: BuildContext) -> Plan:
    plan = _pool_regression(ctx)
    plan.stream_faults = True
    return plan


def _kernel_fallback_sc(ctx: BuildContext) -> Plan:
    fleet_pools = [_train_a(2.0), _train_b(), _serve_a(TrafficSpec(diurnal_amp=0.25))]
    fleet = Fleet(fleet_pools, ctx.devices)
    fault, chg, inc = _kernel_fallback(ctx, fleet, "train-a", 0.5)
    return Plan(fleet, REALISTIC, [fault], [chg], [inc])


def _tiling_sc(ctx: BuildContext) -> Plan:
    fleet = Fleet([_train_a(), _train_b()], ctx.devices)
    fault, chg, inc = _tiling(ctx, fleet, "train-b", 0.5)
    return Plan(fleet, REALISTIC, [fault], [chg], [inc])


def _placement_sc(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.5) + ctx.w
    traffic = TrafficSpec(diurnal_amp=0.25, bursts=ctx.bursts(2.0, avoid=(ctx.quiet(onset),)))
    fleet = Fleet([_serve_a(traffic, 2.0), _train_a()], ctx.devices)
    fault, chg, inc = _placement(ctx, fleet, "serve-a", 0.5)
    return Plan(fleet, REALISTIC, [fault], [chg], [inc])


def _sync_sc(ctx: BuildContext) -> Plan:
    fleet = Fleet([_train_a(2.0), _train_b()], ctx.devices)
    fault, inc = _sync(ctx, fleet, "train-a", 0.5)
    return Plan(fleet, REALISTIC, [fault], [], [inc])


def _thermal_sc(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.4)
    traffic = TrafficSpec(
        diurnal_amp=0.2, base_load=0.4, bursts=ctx.bursts(1.0, avoid=(ctx.quiet(onset, 12),))
    )
    fleet = Fleet([_vision(traffic, 2.0), _train_a()], ctx.devices)
    fault, inc = _thermal(ctx, fleet, "vision", 0.4)
    return Plan(fleet, REALISTIC, [fault], [], [inc])


def _burst_only(ctx: BuildContext) -> Plan:
    w = ctx.w

    def burst(frac: float) -> Burst:
        s = ctx.at(frac)
        return Burst(s, s + round(240.0 / w) * w, 2.5)

    bursts = (burst(0.12), burst(0.3), burst(0.62), burst(0.82))
    fleet = Fleet([_serve_a(TrafficSpec(bursts=bursts), 2.0), _train_b()], ctx.devices)
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
    return Plan(fleet, REALISTIC, [fault], [chg], [inc])


def _ingress_sc(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.5) + ctx.w
    tr = TrafficSpec(diurnal_amp=0.25, bursts=ctx.bursts(1.5, avoid=(ctx.quiet(onset),)))
    fleet = Fleet([_serve_a(tr, 2.0), _serve_moe(TrafficSpec(diurnal_amp=0.25))], ctx.devices)
    fault, chg, inc = _ingress(ctx, fleet, "serve-a", 0.5)
    return Plan(fleet, REALISTIC, [fault], [chg], [inc])


def _quality_sc(ctx: BuildContext) -> Plan:
    onset = ctx.at(0.5) + ctx.w
    tr = TrafficSpec(diurnal_amp=0.25, bursts=ctx.bursts(1.5, avoid=(ctx.quiet(onset),)))
    fleet = Fleet([_serve_a(tr, 2.0), _train_b()], ctx.devices)
    fault, chg, inc = _quality(ctx, fleet, "serve-a", 0.5)
    return Plan(fleet, REALISTIC, [fault], [chg], [inc])


def _healthy(ctx: BuildContext) -> Plan:
    tr_a = TrafficSpec(diurnal_amp=0.3, bursts=ctx.bursts(3.0))
    tr_m = TrafficSpec(diurnal_amp=0.3, bursts=ctx.bursts(3.0))
    fleet = Fleet([_serve_a(tr_a, 2.0), _serve_moe(tr_m), _train_a()], ctx.devices)
    chg = ctx.change("driver", {"pool": "serve-moe"}, "550.90.07", "550.127.05", ctx.at(0.5) + 3.0)
    return Plan(fleet, REALISTIC, [], [chg], [])


def _deploys(ctx: BuildContext) -> Plan:
    w = ctx.w
    t_traffic = ctx.at(0.75)
    tr = TrafficSpec(diurnal_amp=0.25, bursts=ctx.bursts(2.0), steps=((t_traffic, 1.3),))
    fleet = Fleet([_train_a(), _serve_a(tr, 2.0)], ctx.devices)
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
    return Plan(fleet, REALISTIC, [f1, f3], [c1, c2, c3, c4], [])


def _fleet_day(ctx: BuildContext) -> Plan:
    w = ctx.w
    fracs = {"kernel": 0.12, "thermal": 0.28, "placement": 0.44, "ingress": 0.6, "sync": 0.76}
    quiet = tuple(ctx.quiet(ctx.at(f) + w, 12) for f in fracs.values())
    serve_tr = TrafficSpec(diurnal_amp=0.3, bursts=ctx.bursts(1.0, avoid=quiet))
    moe_tr = TrafficSpec(diurnal_amp=0.3, bursts=ctx.bursts(1.0, avoid=quiet))
    vis_tr = TrafficSpec(diurnal_amp=0.2, base_load=0.4, bursts=ctx.bursts(0.5, avoid=quiet))
    fleet = Fleet(
        [
            _train_a(3.0),
            _train_b(2.0),
            _serve_a(serve_tr, 2.0),
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
    return Plan(fleet, REALISTIC, faults, changes, incidents)


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
SCENARIOS: dict[str, Scenario] = {s.name: s for s in _SCENARIOS}


def get(name: str) -> Scenario:
    """The scenario called `name`; raises UnknownScenario."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise UnknownScenario(name) from None
