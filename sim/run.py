"""Run a scenario: window-by-window frames, encoded records and change events, and labels."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from sim.encode import Encoder
from sim.labels import incident_label
from sim.physics import Frame, Physics
from sim.scenarios import BuildContext, Plan, Scenario, get

DEFAULT_START_TS = 1_764_432_000.0
_enc = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class SimWindow:
    """One window of event time: every device's record and the change events that landed in it."""

    index: int
    ts: float  # end of the window
    records: list[tuple[bytes, bytes]]  # (device id, window record JSON)
    changes: list[tuple[bytes, bytes]]  # (scope key, change event JSON)

    def lines(self) -> list[bytes]:
        """The window as recording lines: change events first, so that a replay sees a
        deploy before the regression it causes."""
        return [v for _, v in self.changes] + [v for _, v in self.records]


@dataclass(slots=True)
class StreamFaultStats:
    """What the dirty-stream injector did (ground truth for decoder tests)."""

    duplicates: int = 0
    late: int = 0
    malformed: int = 0
    gap_records: int = 0
    malformed_examples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready counts and the malformed records' (ts, device, kind)."""
        return {
            "duplicates": self.duplicates,
            "late": self.late,
            "malformed": self.malformed,
            "gap_records": self.gap_records,
            "malformed_records": list(self.malformed_examples),
        }


class Simulation:
    """A configured scenario run; `windows()` can be iterated any number of times, same bytes."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        devices: int,
        duration_s: float,
        seed: int,
        window_s: float,
        start_ts: float,
        faults: bool = False,
        wide: bool = False,
    ) -> None:
        if window_s <= 0 or duration_s < window_s:
            raise ValueError("need window_s > 0 and duration_s >= window_s")
        self.scenario = scenario
        self.devices = devices
        self.duration_s = duration_s
        self.seed = seed
        self.window_s = window_s
        self.start_ts = start_ts
        self.n_windows = round(duration_s / window_s)
        self.wide = wide or scenario.pack == "wide"
        ctx = BuildContext(
            scenario.name, devices, duration_s, seed, window_s, start_ts, wide=self.wide
        )
        self.plan: Plan = scenario.build(ctx)
        self.stream_faults = faults or self.plan.stream_faults
        self.fleet = self.plan.fleet
        self.stream_stats = StreamFaultStats()
        self._labels: dict[str, Any] | None = None

    def physics(self) -> Physics:
        """A fresh physics state at the start of the run."""
        return Physics(
            self.fleet,
            list(self.plan.faults),
            self.plan.noise,
            seed=self.seed,
            window_s=self.window_s,
            start_ts=self.start_ts,
            join_ts=self.plan.join_ts,
        )

    def frames(self) -> Iterator[Frame]:
        """Window frames as arrays (no encoding), in event-time order."""
        phys = self.physics()
        for k in range(self.n_windows):
            yield phys.step(k)

    def windows(self) -> Iterator[SimWindow]:
        """Encoded windows in event-time order; deterministic for the seed."""
        enc = Encoder(self.fleet, self.window_s)
        changes = sorted(self.plan.changes, key=lambda c: c.ts)
        ci = 0
        dirty = None
        if self.stream_faults:
            self.stream_stats = StreamFaultStats()
            dirty = _Dirty(self, self.stream_stats)
        for frame in self.frames():
            lo = frame.ts - self.window_s
            landed: list[tuple[bytes, bytes]] = []
            while ci < len(changes) and changes[ci].ts <= frame.ts:
                ch = changes[ci]
                if ch.ts > lo or frame.k == 0:
                    landed.append((ch.key, _enc.encode(ch.to_dict())))
                ci += 1
            records = enc.encode(frame)
            if dirty is not None:
                records = dirty.apply(frame.k, frame.ts, records)
            yield SimWindow(frame.k, frame.ts, records, landed)

    @property
    def labels(self) -> dict[str, Any]:
        """Ground truth of the run (JSON-serialisable); computed once, on first access."""
        if self._labels is None:
            self._labels = self._compute_labels()
        if self.stream_faults:
            self._labels["stream_faults"] = self.stream_stats.as_dict()
        return self._labels

    def _compute_labels(self) -> dict[str, Any]:
        f = self.fleet
        end = self.start_ts + self.n_windows * self.window_s
        pools: list[dict[str, Any]] = []
        for p_i, p in enumerate(f.pools):
            devs = f.pool_devices(p.name)
            bursts = [[b.start, b.end, b.mult] for b in p.traffic.bursts]
            pools.append(
                {
                    "name": p.name,
                    "model": p.model,
                    "workload": p.workload,
                    "hw": p.hardware[0][0],
                    "dtype": p.dtype,
                    "mode": "train" if f.is_train[devs[0]] else "serve",
                    "devices": len(devs),
                    "hosts": len(f.pool_hosts(p.name)),
                    "layers": [lt for j, lt in enumerate(f.layers) if f.pool_present[p_i, j]],
                    "bursts": bursts,
                }
            )
            if p.hw_mix:
                hws = [f.device_hw[d] for d in devs.tolist()]
                pools[-1]["hw_mix"] = {hw: hws.count(hw) for hw, _ in p.hw_mix}
            if p.traffic.headroom is not None:
                pools[-1]["headroom"] = p.traffic.headroom
                pools[-1]["max_queue_s"] = p.traffic.max_queue_s
        extra: dict[str, Any] = {}
        if self.wide:
            extra["wide"] = True
        if self.plan.join_ts is not None:
            late = np.isfinite(self.plan.join_ts)
            extra["joins"] = [
                {
                    "ts": float(t),
                    "pool": f.pools[
                        int(f.pool_idx[np.flatnonzero(self.plan.join_ts == t)[0]])
                    ].name,
                    "hosts": sorted({f.host_names[h] for h in f.host_idx[self.plan.join_ts == t]}),
                    "devices": int((self.plan.join_ts == t).sum()),
                }
                for t in sorted(set(self.plan.join_ts[late].tolist()))
            ]
        return extra | {
            "scenario": self.scenario.name,
            "description": self.scenario.description,
            "seed": self.seed,
            "devices": self.devices,
            "window_s": self.window_s,
            "start_ts": self.start_ts,
            "duration_s": self.n_windows * self.window_s,
            "pools": pools,
            "incidents": [
                incident_label(
                    inc,
                    self.plan,
                    seed=self.seed,
                    window_s=self.window_s,
                    start_ts=self.start_ts,
                    end_ts=end,
                )
                for inc in self.plan.incidents
            ],
            "changes": [c.to_dict() for c in sorted(self.plan.changes, key=lambda c: c.ts)],
        }


class _Dirty:
    """Injects duplicates, late records, host gaps and malformed lines (seeded, per window)."""

    DUP, LATE, BAD, GAP = 0.002, 0.002, 0.001, 0.002

    def __init__(self, sim: Simulation, stats: StreamFaultStats) -> None:
        self.sim = sim
        self.stats = stats
        self.held: list[tuple[bytes, bytes]] = []
        self.gap_left: dict[bytes, int] = {}
        self.hosts = {k: k.split(b"/")[0] for k in (d.encode() for d in sim.fleet.device_names)}
        self.host_list = sorted(set(self.hosts.values()))

    def apply(
        self, k: int, ts: float, records: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        rng = np.random.Generator(np.random.PCG64([self.sim.seed, 0xD127, k]))
        st = self.stats
        for _ in range(int(rng.poisson(self.GAP * len(self.host_list)))):
            host = self.host_list[int(rng.integers(0, len(self.host_list)))]
            self.gap_left[host] = int(rng.integers(2, 7))
        if self.gap_left:
            kept = [r for r in records if self.gap_left.get(self.hosts[r[0]], 0) == 0]
            st.gap_records += len(records) - len(kept)
            records = kept
            self.gap_left = {h: n - 1 for h, n in self.gap_left.items() if n > 1}
        n = len(records)
        out = list(records)
        if n:
            n_late = int(rng.poisson(self.LATE * n)) if k < self.sim.n_windows - 1 else 0
            late = set(rng.choice(n, size=min(n, n_late), replace=False).tolist())
            bad = rng.choice(n, size=min(n, int(rng.poisson(self.BAD * n))), replace=False)
            for i in bad.tolist():
                if i in late:
                    continue
                key, val = out[i]
                kind = _CORRUPTIONS[int(rng.integers(0, len(_CORRUPTIONS)))]
                out[i] = (key, _corrupt(kind, val))
                st.malformed += 1
                st.malformed_examples.append({"ts": ts, "device": key.decode(), "kind": kind})
            dups = rng.choice(n, size=min(n, int(rng.poisson(self.DUP * n))), replace=False)
            extra = [records[i] for i in dups.tolist() if i not in late]
            st.duplicates += len(extra)
            held_now = [records[i] for i in sorted(late)]
            out = [r for i, r in enumerate(out) if i not in late] + extra
        else:
            held_now = []
        out += self.held  # last window's late records arrive after this window's
        st.late += len(self.held)
        self.held = held_now
        return out


_CORRUPTIONS = ("truncated", "negative_busy", "missing_device", "not_json", "stall_gt_cycles")


def _corrupt(kind: str, val: bytes) -> bytes:
    match kind:
        case "truncated":
            return val[: len(val) // 2]
        case "negative_busy":
            return val.replace(b'"busy_s":', b'"busy_s":-', 1)
        case "missing_device":
            return val.replace(b'"device":', b'"dev1ce":', 1)
        case "stall_gt_cycles":
            return val.replace(b'"stall_mem_cycles":', b'"stall_mem_cycles":9', 1)
    return b"\x00\xff not json"


def simulate(
    scenario: str,
    *,
    devices: int | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    window_s: float = 10.0,
    start_ts: float = DEFAULT_START_TS,
    faults: bool = False,
    wide: bool = False,
) -> Simulation:
    """Configure a run of the named scenario; raises UnknownScenario for an unknown name.

    `wide` draws the physics (noise level and shape, traffic, headroom, pool sizes) per
    seed; scenarios of the wide pack always do."""
    sc = get(scenario)
    return Simulation(
        sc,
        devices=devices or sc.default_devices,
        duration_s=duration_s if duration_s is not None else sc.default_duration_s,
        seed=seed,
        window_s=window_s,
        start_ts=start_ts,
        faults=faults,
        wide=wide,
    )
