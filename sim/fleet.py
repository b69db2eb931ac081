"""Fleet topology (pools, hosts of 8, devices) and the per-device coefficient arrays."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from monitor.arrays import F64, I64, Bools
from monitor.hardware import DEFAULT_CATALOG, HardwareSpec
from sim.traffic import TrafficSpec
from sim.workloads import LAYER_TYPES, WORKLOADS, Workload

DEVICES_PER_HOST = 8


@dataclass(frozen=True, slots=True)
class Board:
    """Board-level traits the catalog does not carry: power, cooling, links, sustained clock."""

    tdp_w: float
    idle_w: float
    throttle_c: float  # temperature above which the clock steps down
    clock_ratio: float  # sustained clock under load / max boost clock
    r_th: float  # degC per W from inlet to die at nominal cooling
    nvlink_bytes_per_s: float  # per device, intra-host collectives
    net_bytes_per_s: float  # per device, inter-host collectives
    max_clock_mhz: float


BOARDS: dict[str, Board] = {
    "h100-sxm": Board(700.0, 80.0, 85.0, 0.93, 0.06, 450e9, 50e9, 1980.0),
    "h200": Board(700.0, 80.0, 85.0, 0.93, 0.06, 450e9, 50e9, 1980.0),
    "a100-sxm": Board(400.0, 55.0, 85.0, 0.95, 0.1, 300e9, 25e9, 1410.0),
    "b200": Board(1000.0, 120.0, 85.0, 0.92, 0.045, 900e9, 50e9, 1965.0),
    "mi300x": Board(750.0, 90.0, 90.0, 0.9, 0.055, 448e9, 50e9, 2100.0),
    "tpu-v5e": Board(200.0, 40.0, 80.0, 1.0, 0.18, 200e9, 25e9, 1500.0),
    "tpu-v5p": Board(450.0, 70.0, 80.0, 1.0, 0.09, 600e9, 50e9, 1750.0),
}


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One fleet partition: a workload on one hardware type, with its traffic."""

    name: str
    workload: str  # key into WORKLOADS, e.g. "llama-70b/train"
    version: str  # model version, e.g. "v12"
    hw: str = "h100-sxm"
    dtype: str = "bf16"
    share: float = 1.0  # relative share of the fleet's hosts
    traffic: TrafficSpec = field(default_factory=TrafficSpec)
    versions: tuple[str, ...] = ()  # later versions a scenario may deploy
    # (hw, share of the pool's hosts) pairs when the pool mixes hardware; overrides `hw`
    hw_mix: tuple[tuple[str, float], ...] = ()
    quality: float | None = None  # validation quality of the base version (default: workload's)

    @property
    def hardware(self) -> tuple[tuple[str, float], ...]:
        """(hw, share of hosts) pairs: `hw_mix`, or `hw` alone."""
        return self.hw_mix or ((self.hw, 1.0),)

    @property
    def model(self) -> str:
        """Workload identity as the record carries it (model@version)."""
        return f"{WORKLOADS[self.workload].name}@{self.version}"


class Fleet:
    """Topology plus per-device (D,) and per-device x layer (D, L) coefficient arrays."""

    def __init__(self, pools: list[PoolSpec], devices: int) -> None:
        if devices < DEVICES_PER_HOST * len(pools):
            raise ValueError(
                f"{len(pools)} pools need at least {DEVICES_PER_HOST * len(pools)} devices"
            )
        self.pools = pools
        n_hosts = -(-devices // DEVICES_PER_HOST)
        shares = np.array([p.share for p in pools], dtype=np.float64)
        # at least one host per pool, the rest by share (largest remainder)
        spare = n_hosts - len(pools)
        raw = shares / shares.sum() * spare
        hosts_per_pool = np.floor(raw).astype(np.int64) + 1
        left = n_hosts - int(hosts_per_pool.sum())
        order = np.argsort(-(raw - np.floor(raw)), kind="stable")
        hosts_per_pool[order[:left]] += 1
        host_pool = np.repeat(np.arange(len(pools)), hosts_per_pool)
        # a variant is one (pool, hw) pair; a pool without a mix is one variant
        self.variants: list[tuple[int, str]] = []
        host_var: list[int] = []
        for p, spec in enumerate(pools):
            counts = _split(int(hosts_per_pool[p]), [s for _, s in spec.hardware])
            for (hw, _), c in zip(spec.hardware, counts, strict=True):
                host_var += [len(self.variants)] * c
                self.variants.append((p, hw))
        sizes = np.full(n_hosts, DEVICES_PER_HOST, dtype=np.int64)
        sizes[-1] = devices - DEVICES_PER_HOST * (n_hosts - 1)
        self.n = devices
        self.host_idx: I64 = np.repeat(np.arange(n_hosts), sizes)
        self.host_starts: I64 = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.pool_idx: I64 = host_pool[self.host_idx]
        self.var_idx: I64 = np.asarray(host_var, dtype=np.int64)[self.host_idx]
        self.device_hw: list[str] = [self.variants[v][1] for v in self.var_idx.tolist()]
        width = max(3, len(str(n_hosts - 1)))
        self.host_names = [f"node-{h:0{width}d}" for h in range(n_hosts)]
        slot = np.arange(devices) - self.host_starts[self.host_idx]
        self.device_names = [
            f"{self.host_names[h]}/gpu{s}"
            for h, s in zip(self.host_idx.tolist(), slot.tolist(), strict=True)
        ]
        # models: one table of model@version strings; a device points at its row
        self.model_names: list[str] = []
        self.model_row: dict[tuple[int, str], int] = {}
        for p, spec in enumerate(pools):
            for ver in (spec.version, *spec.versions):
                self.model_row[(p, ver)] = len(self.model_names)
                self.model_names.append(f"{WORKLOADS[spec.workload].name}@{ver}")
        base_rows = np.array([self.model_row[(p, s.version)] for p, s in enumerate(pools)])
        self.base_model_idx: I64 = base_rows[self.pool_idx].astype(np.int64)
        self._build_coefficients()

    def _build_coefficients(self) -> None:
        used = {lt for p in self.pools for lt in WORKLOADS[p.workload].layers}
        self.layers: tuple[str, ...] = tuple(lt for lt in LAYER_TYPES if lt in used)
        n_l = len(self.layers)
        n_p = len(self.pools)
        names = ["flops_tok", "weight_bytes", "act_bytes_tok", "reuse_bytes_tok", "kernels"]
        tab = {k: np.zeros((n_p, n_l)) for k in names}
        eff_c = np.ones((n_p, n_l))
        eff_m = np.ones((n_p, n_l))
        occ = np.zeros((n_p, n_l))
        hit = np.zeros((n_p, n_l))
        present = np.zeros((n_p, n_l), dtype=np.bool_)
        self.kernel_names: list[str] = []
        kidx: dict[str, int] = {}
        kern = np.zeros((n_p, n_l), dtype=np.int64)
        fb = np.zeros((n_p, n_l), dtype=np.int64)

        def kernel_id(name: str) -> int:
            if name not in kidx:
                kidx[name] = len(self.kernel_names)
                self.kernel_names.append(name)
            return kidx[name]

        per_pool: dict[str, list[float]] = {
            k: []
            for k in (
                "peak",
                "bw",
                "max_clock",
                "tdp",
                "idle",
                "throttle",
                "clock_ratio",
                "r_th",
                "nvlink",
                "net",
                "train",
                "tokens_per_step",
                "micro_batch",
                "gen",
                "tok_per_seq",
                "max_batch",
                "tick",
                "comm_tok",
                "comm_step",
                "quality",
                "tp_local",
            )
        }
        for p, spec in enumerate(self.pools):
            for j, lt in enumerate(self.layers):
                cost = WORKLOADS[spec.workload].layers.get(lt)
                if cost is None:
                    continue
                present[p, j] = True
                for k in names:
                    tab[k][p, j] = getattr(cost, k)
                eff_c[p, j], eff_m[p, j] = cost.eff_compute, cost.eff_mem
                occ[p, j], hit[p, j] = cost.occupancy, cost.sram_hit
                kern[p, j] = kernel_id(cost.kernel)
                fb[p, j] = kernel_id(cost.fallback_kernel)
        for p, hw_name in self.variants:
            spec = self.pools[p]
            wl: Workload = WORKLOADS[spec.workload]
            hw: HardwareSpec = DEFAULT_CATALOG[hw_name]
            board = BOARDS[hw_name]
            peak = hw.peak(spec.dtype)
            if peak is None:
                raise ValueError(f"{hw_name} has no peak for dtype {spec.dtype}")
            vals = {
                "peak": peak,
                "bw": hw.hbm_bytes_per_s,
                "max_clock": hw.max_clock_mhz or board.max_clock_mhz,
                "tdp": board.tdp_w,
                "idle": board.idle_w,
                "throttle": board.throttle_c,
                "clock_ratio": board.clock_ratio,
                "r_th": board.r_th,
                "nvlink": board.nvlink_bytes_per_s,
                "net": board.net_bytes_per_s,
                "train": 1.0 if wl.mode == "train" else 0.0,
                "tokens_per_step": wl.tokens_per_step,
                "micro_batch": wl.micro_batch,
                "gen": wl.gen_tokens,
                "tok_per_seq": wl.tokens_per_seq,
                "max_batch": wl.max_batch,
                "tick": wl.tick_s,
                "comm_tok": wl.comm_bytes_tok,
                "comm_step": wl.comm_bytes_step,
                "quality": wl.quality if spec.quality is None else spec.quality,
                "tp_local": 1.0 if wl.comm_bytes_tok > 0 else 0.0,
            }
            for k, v in vals.items():
                per_pool[k].append(float(v))
        pi = self.pool_idx
        self.flops_tok: F64 = tab["flops_tok"][pi]
        self.weight_bytes: F64 = tab["weight_bytes"][pi]
        self.act_bytes_tok: F64 = tab["act_bytes_tok"][pi]
        self.reuse_bytes_tok: F64 = tab["reuse_bytes_tok"][pi]
        self.kernels: F64 = tab["kernels"][pi]
        self.eff_c: F64 = eff_c[pi]
        self.eff_m: F64 = eff_m[pi]
        self.occupancy: F64 = occ[pi]
        self.sram_hit: F64 = hit[pi]
        self.present: Bools = present[pi]
        self.layer_counts: F64 = self.present.sum(axis=1).astype(np.float64)
        self.kernel_base: I64 = kern[pi]
        self.kernel_fallback: I64 = fb[pi]
        self.pool_present = present
        self.dev: dict[str, F64] = {k: np.asarray(v)[self.var_idx] for k, v in per_pool.items()}
        self.is_train: Bools = self.dev["train"] > 0.5
        self.allreduce_col = self.layers.index("allreduce") if "allreduce" in self.layers else -1

    def kernel_id(self, name: str) -> int:
        """Row of `name` in the kernel-name table, adding it when new."""
        if name not in self.kernel_names:
            self.kernel_names.append(name)
        return self.kernel_names.index(name)

    def layer_col(self, layer: str) -> int:
        """Column of a layer type in the (D, L) arrays."""
        return self.layers.index(layer)

    def pool_id(self, name: str) -> int:
        """Index of pool `name`."""
        return [p.name for p in self.pools].index(name)

    def pool_devices(self, name: str) -> I64:
        """Device indices of pool `name`."""
        return np.flatnonzero(self.pool_idx == self.pool_id(name)).astype(np.int64)

    def pool_hosts(self, name: str) -> I64:
        """Host indices of pool `name`."""
        return np.unique(self.host_idx[self.pool_devices(name)])

    def host_devices(self, host: int) -> I64:
        """Device indices of host number `host`."""
        return np.flatnonzero(self.host_idx == host).astype(np.int64)


def _split(n: int, shares: list[float]) -> list[int]:
    """`n` items split by `shares` (largest remainder), at least one each while n allows."""
    w = np.asarray(shares, dtype=np.float64)
    raw = w / w.sum() * n
    out = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - out), kind="stable")
    out[order[: n - int(out.sum())]] += 1
    for i in range(len(out)):  # a mixed pool keeps every hardware type it names
        if out[i] == 0 and out.max() > 1:
            out[int(np.argmax(out))] -= 1
            out[i] = 1
    return [int(c) for c in out]
