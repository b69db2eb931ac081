"""Fault effects: each writes a vectorised modification into the window's `Modifiers`."""

from __future__ import annotations

from dataclasses import dataclass

from monitor.arrays import F64, I64
from sim.fleet import Fleet
from sim.physics import Modifiers


@dataclass(slots=True)
class Fault:
    """Base: active on windows that start at or after `onset_ts` (and before `end_ts`)."""

    onset_ts: float
    devices: I64
    end_ts: float | None

    def active(self, t_start: float) -> bool:
        """Whether the window starting at `t_start` is affected."""
        return t_start >= self.onset_ts - 1e-6 and (self.end_ts is None or t_start < self.end_ts)

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        """Write the effect into `mods`."""
        raise NotImplementedError


@dataclass(slots=True)
class KernelFallback(Fault):
    """Lowering picks another kernel variant; a share of ops runs on slower fallback kernels."""

    col: int = 0
    frac: float = 0.4
    slow: float = 1.45  # a fallback op takes this many times as long as the primary
    kernel_row: int = -1

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        loc = mods.local(self.devices)
        mods.dl("fallback", 0.0)[loc, self.col] = self.frac
        mods.dl("fallback_slow", 1.0)[loc, self.col] = self.slow
        if self.kernel_row >= 0:
            mods.kernel_rows()[loc, self.col] = self.kernel_row


@dataclass(slots=True)
class KernelSwap(Fault):
    """A harmless kernel upgrade: the variant name changes, performance does not."""

    col: int = 0
    kernel_row: int = -1

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        mods.kernel_rows()[mods.local(self.devices), self.col] = self.kernel_row


@dataclass(slots=True)
class Tiling(Fault):
    """Smaller / worse tiles: more re-reads, lower SRAM hit rate and occupancy, slower MMA."""

    col: int = 0
    tile: float = 0.5
    hit_scale: float = 0.7
    occ_scale: float = 0.7
    eff_scale: float = 0.9
    min_tokens: float = 0.0  # only steps with more tokens than this pick the bad tile

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        loc = mods.local(self.devices)
        if self.min_tokens > 0:
            loc = loc[tokens[loc] > self.min_tokens]
        mods.dl("tile", 1.0)[loc, self.col] = self.tile
        mods.dl("hit_scale", 1.0)[loc, self.col] = self.hit_scale
        mods.dl("occ_scale", 1.0)[loc, self.col] = self.occ_scale
        mods.dl("eff_scale", 1.0)[loc, self.col] = self.eff_scale


@dataclass(slots=True)
class MemoryPlacement(Fault):
    """Buffers placed off-chip: spill traffic to HBM and a lower SRAM hit rate."""

    col: int = 0
    spill_frac: float = 0.4
    hit_scale: float = 0.8

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        loc = mods.local(self.devices)
        mods.dl("spill_frac", 0.0)[loc, self.col] = self.spill_frac
        mods.dl("hit_scale", 1.0)[loc, self.col] = self.hit_scale


@dataclass(slots=True)
class Contention(Fault):
    """Link contention on a host: collectives wait `factor` x their transfer time."""

    factor: float = 4.0

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        mods.d("contention", 1.0)[mods.local(self.devices)] = self.factor


@dataclass(slots=True)
class Cooling(Fault):
    """Degraded cooling (fan / airflow): thermal resistance x `factor`, the clock throttles."""

    factor: float = 4.0

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        mods.d("cooling", 1.0)[mods.local(self.devices)] = self.factor


@dataclass(slots=True)
class IngressDelay(Fault):
    """Router admission delay (e.g. a rate-limit policy): requests wait before batching."""

    delay_ms: float = 250.0

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        mods.d("ingress_delay_ms", 0.0)[mods.local(self.devices)] = self.delay_ms


@dataclass(slots=True)
class ModelDeploy(Fault):
    """A new model version: the record's model changes; quality may shift by `quality_delta`
    and a share `error_rate` of its requests fail outright."""

    model_row: int = 0
    quality_delta: float = 0.0
    error_rate: float = 0.0

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        loc = mods.local(self.devices)
        mods.model_rows()[loc] = self.model_row
        if self.quality_delta:
            mods.d("quality_delta", 0.0)[loc] = self.quality_delta
        if self.error_rate:
            mods.d("error_rate", 0.0)[loc] = self.error_rate


@dataclass(slots=True)
class NicSlowdown(Fault):
    """A degraded NIC on a host: its collectives wait `factor` x as long for their peers."""

    factor: float = 2.5

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        mods.d("sync_scale", 1.0)[mods.local(self.devices)] = self.factor


@dataclass(slots=True)
class ModelSwap(ModelDeploy):
    """A different model behind the same layer types: per-layer costs scale (ratios, (L,))."""

    flops: F64 | None = None
    bytes_: F64 | None = None
    weights: F64 | None = None

    def apply(self, mods: Modifiers, fleet: Fleet, tokens: F64) -> None:
        ModelDeploy.apply(self, mods, fleet, tokens)
        loc = mods.local(self.devices)
        for name, ratio in (
            ("flops_scale", self.flops),
            ("bytes_scale", self.bytes_),
            ("weight_scale", self.weights),
        ):
            if ratio is not None:
                mods.dl(name, 1.0)[loc] = ratio
