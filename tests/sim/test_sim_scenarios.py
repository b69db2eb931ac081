"""Every scenario: records decode, labelled indicators move where and when the labels say,
upstream stages stay flat, and the healthy scenarios have no level shift once load is accounted for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from monitor.wire import STAGES
from sim.run import Simulation
from sim.scenarios import SCENARIOS
from sim.testing import Decoded, series, span_mean

RunCache = Callable[[str], tuple[Simulation, Decoded]]

INCIDENT_SCENARIOS = [
    "pool_regression",
    "kernel_fallback",
    "tiling_regression",
    "memory_placement",
    "sync_contention",
    "thermal_throttle",
    "burst_only_regression",
    "ingress_queueing",
    "quality_regression",
    "fleet_day",
    "nic_slowdown",
    "quality_drop",
    "error_rise",
    "thermal_small",
    "fallback_in_overload",
]
HEALTHY = ["healthy_with_bursts", "deploy_without_regression"]
# healthy, with legitimate level shifts (model swap, hosts joining, mixed hardware) that the
# classic no-level-shift test does not allow: tests/sim/test_sim_wide.py covers them
WIDE_HEALTHY = ["overload_bursts", "model_swap", "mixed_joins", "healthy_fleet"]
UPSTREAM_DEVICE = {
    "ingress": ["req_rate", "queue_depth", "queue_wait_ms", "batch"],
    "execution": ["power_w", "clock_mhz"],
}
UPSTREAM_LAYER = {
    "lowering": ["fallback_frac"],
    "scheduling": ["sram_hit", "intensity"],
    "execution": ["mfu", "stall_frac", "occupancy"],
}
FLAT = 0.03  # relative change below which an indicator "did not move"


def _flat(
    ts: np.ndarray, vals: np.ndarray, base: tuple[float, float], eff: tuple[float, float]
) -> tuple[bool, str]:
    """Whether an indicator stayed flat: within 3% or within 4 sd of its window-to-window noise."""
    before, after = span_mean(ts, vals, base), span_mean(ts, vals, eff)
    noise = float(np.std(vals[(ts > base[0]) & (ts <= base[1])]))
    ok = abs(after - before) <= max(FLAT * abs(before), 4 * noise)
    return ok, f"{before} -> {after} (noise {noise:.3g})"


def _incidents(name: str) -> list[tuple[str, int]]:
    return [(name, i) for i in range(_N_INCIDENTS[name])]


_N_INCIDENTS = {
    "pool_regression": 1,
    "kernel_fallback": 1,
    "tiling_regression": 1,
    "memory_placement": 1,
    "sync_contention": 1,
    "thermal_throttle": 1,
    "burst_only_regression": 1,
    "ingress_queueing": 1,
    "quality_regression": 1,
    "fleet_day": 5,
    "nic_slowdown": 1,
    "quality_drop": 1,
    "error_rise": 1,
    "thermal_small": 1,
    "fallback_in_overload": 1,
}
CASES = [case for name in INCIDENT_SCENARIOS for case in _incidents(name)]


def _rel(before: float, after: float) -> float:
    return after / before - 1.0 if before else (0.0 if after == before else float("inf"))


def _spans(inc: dict[str, Any]) -> tuple[tuple[float, float], tuple[float, float]]:
    return (inc["baseline"][0], inc["baseline"][1]), (inc["effect"][0], inc["effect"][1])


def _pool_layers(dec: Decoded, pool: str) -> list[str]:
    rec = next(r for ts in dec.ts for r in dec.records[ts] if r.pool == pool)
    return [x.type for x in rec.layers]


def test_every_scenario_is_covered(run_sizes: dict[str, tuple[int, float, float]]) -> None:
    """The test matrix names every registered scenario."""
    assert set(run_sizes) == set(SCENARIOS)
    assert set(INCIDENT_SCENARIOS) | set(HEALTHY) | set(WIDE_HEALTHY) | {"dirty_stream"} == set(
        SCENARIOS
    )


@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - {"dirty_stream"}))
def test_every_record_decodes(scenario_run: RunCache, name: str) -> None:
    """Every record of every scenario validates with the monitor's codec, keyed by device."""
    sim, dec = scenario_run(name)
    assert len(dec.ts) == sim.n_windows
    n_rec = sum(len(dec.records[ts]) for ts in dec.ts)
    # silences drop a few device-windows in the realistic scenarios, never many; hosts that
    # join mid-run report from their join on
    late = sum(
        j["devices"] * round((j["ts"] - sim.start_ts) / sim.window_s)
        for j in sim.labels.get("joins", [])
    )
    expected = sim.devices * sim.n_windows - late
    assert 0.99 * expected <= n_rec <= expected
    assert len(dec.changes) == len(sim.labels["changes"])
    for win_ts, _key, _value in dec.changes:
        assert sim.start_ts < win_ts <= sim.start_ts + sim.duration_s


@pytest.mark.parametrize(("name", "i"), CASES)
def test_labelled_indicators_move_in_scope(scenario_run: RunCache, name: str, i: int) -> None:
    """Each labelled indicator moves in the labelled direction, roughly by the labelled amount."""
    sim, dec = scenario_run(name)
    inc = sim.labels["incidents"][i]
    scope = set(inc["scope"]["devices"])
    base, eff = _spans(inc)
    for ind in inc["indicators"]:
        ts, vals = series(dec, ind["name"], ind["layer"], devices=scope)
        before, after = span_mean(ts, vals, base), span_mean(ts, vals, eff)
        noise = float(np.std(vals[(ts > base[0]) & (ts <= base[1])])) + 1e-12
        where = f"{inc['id']} {ind['name']}/{ind['layer']}"
        assert abs(after - before) > 4 * noise, f"{where}: {before} -> {after} within noise"
        if ind["before"]:
            obs, lab = _rel(before, after), _rel(ind["before"], ind["after"])
            assert np.sign(obs) == np.sign(lab), f"{where}: moved {obs:+.3f}, label {lab:+.3f}"
            assert 0.5 < obs / lab < 2.0, f"{where}: moved {obs:+.3f}, label {lab:+.3f}"
        else:
            assert after == pytest.approx(ind["after"], rel=0.25), where


@pytest.mark.parametrize(("name", "i"), CASES)
def test_onset_is_where_the_labels_say(scenario_run: RunCache, name: str, i: int) -> None:
    """The last window before the onset is clean; a step change shows in the first window after."""
    sim, dec = scenario_run(name)
    inc = sim.labels["incidents"][i]
    scope = set(inc["scope"]["devices"])
    base, eff = _spans(inc)
    onset = inc["onset_ts"]
    w = sim.window_s
    assert onset == inc["onset_window_ts"] - w
    for ind in inc["indicators"]:
        ts, vals = series(dec, ind["name"], ind["layer"], devices=scope)
        before, after = span_mean(ts, vals, base), span_mean(ts, vals, eff)
        last_clean = vals[ts == onset]
        first = vals[ts == onset + w]
        where = f"{inc['id']} {ind['name']}/{ind['layer']}"
        if inc["condition"] != "burst":  # the burst-only baseline is an earlier burst
            assert abs(last_clean[0] - before) < 0.25 * abs(after - before), where
        if inc["bottleneck"] != "thermal":  # temperature climbs over minutes
            assert abs(first[0] - before) > 0.5 * abs(after - before), where


@pytest.mark.parametrize(("name", "i"), CASES)
def test_upstream_stages_stay_flat(scenario_run: RunCache, name: str, i: int) -> None:
    """Indicators of stages upstream of the first failing one do not move (nor the `unchanged`)."""
    sim, dec = scenario_run(name)
    inc = sim.labels["incidents"][i]
    scope = set(inc["scope"]["devices"])
    base, eff = _spans(inc)
    upstream = STAGES[: STAGES.index(inc["first_failing_stage"])]
    checks: list[tuple[str, str | None]] = [(u["name"], u["layer"]) for u in inc["unchanged"]]
    layers = [lt for lt in _pool_layers(dec, inc["scope"]["pool"]) if lt != "allreduce"]
    for stage in upstream:
        checks += [(nm, None) for nm in UPSTREAM_DEVICE.get(stage, [])]
        checks += [(nm, lt) for nm in UPSTREAM_LAYER.get(stage, []) for lt in layers]
    for nm, layer in checks:
        ts, vals = series(dec, nm, layer, devices=scope)
        ok, why = _flat(ts, vals, base, eff)
        assert ok, f"{inc['id']} {nm}/{layer}: {why}"
    if "lowering" in upstream:

        def kernels(span: tuple[float, float], layer: str) -> set[str | None]:
            return {
                x.kernel
                for ts in dec.ts
                if span[0] < ts <= span[1]
                for r in dec.records[ts]
                if r.device in scope
                for x in r.layers
                if x.type == layer
            }

        for layer in layers:
            kb, ke = kernels(base, layer), kernels(eff, layer)
            assert kb == ke, f"{inc['id']} kernel/{layer}: {kb} -> {ke}"


@pytest.mark.parametrize(("name", "i"), CASES)
def test_outside_the_scope_stays_flat(scenario_run: RunCache, name: str, i: int) -> None:
    """Devices outside the labelled scope (same pool or not) keep their primary indicators."""
    sim, dec = scenario_run(name)
    inc = sim.labels["incidents"][i]
    scope = set(inc["scope"]["devices"])
    others_same_pool = {
        r.device
        for r in dec.records[dec.ts[0]]
        if r.pool == inc["scope"]["pool"] and r.device not in scope
    }
    other_pools = {p["name"] for p in sim.labels["pools"]} - {inc["scope"]["pool"]}
    # other incidents of a fleet_day may overlap in time on other pools
    busy = {o["scope"]["pool"] for o in sim.labels["incidents"] if o["id"] != inc["id"]}
    base, eff = _spans(inc)
    for ind in inc["indicators"]:
        groups = [others_same_pool] if others_same_pool else []
        groups += [
            {r.device for r in dec.records[dec.ts[0]] if r.pool == p}
            for p in sorted(other_pools - busy)
        ]
        for devs in groups:
            ts, vals = series(dec, ind["name"], ind["layer"], devices=devs)
            if len(ts) == 0:
                continue  # the layer type does not exist there
            ok, why = _flat(ts, vals, base, eff)
            assert ok, f"{inc['id']} {ind['name']}/{ind['layer']} outside scope: {why}"


@pytest.mark.parametrize(("name", "i"), CASES)
def test_labels_are_consistent(scenario_run: RunCache, name: str, i: int) -> None:
    """Labels name a contract stage, an existing scope, and an existing change (or None)."""
    sim, dec = scenario_run(name)
    inc = sim.labels["incidents"][i]
    assert inc["first_failing_stage"] in STAGES
    assert all(x["stage"] in STAGES for x in inc["indicators"])
    # the first failing stage is the most upstream stage among the moving indicators
    assert inc["first_failing_stage"] == min(
        (x["stage"] for x in inc["indicators"]), key=STAGES.index
    )
    devs = {r.device for r in dec.records[dec.ts[0]]}
    assert set(inc["scope"]["devices"]) <= devs
    assert inc["scope"]["device_count"] == len(inc["scope"]["devices"])
    level = inc["scope"]["level"]
    hosts = {d.split("/")[0] for d in inc["scope"]["devices"]}
    assert level != "host" or len(hosts) == 1
    ids = {c["id"]: c for c in sim.labels["changes"]}
    if inc["change_id"] is not None:
        chg = ids[inc["change_id"]]
        assert chg["scope"].get("pool") == inc["scope"]["pool"]
        assert chg["ts"] <= inc["onset_window_ts"]
    else:
        assert inc["bottleneck"] in {"sync", "thermal"}


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_scenarios_have_bursts_and_deploys(scenario_run: RunCache, name: str) -> None:
    """Healthy runs contain traffic bursts and change events, and no incidents."""
    sim, dec = scenario_run(name)
    assert sim.labels["incidents"] == []
    assert len(sim.labels["changes"]) >= 1
    assert any(p["bursts"] for p in sim.labels["pools"])
    serve = [p["name"] for p in sim.labels["pools"] if p["mode"] == "serve"]
    for pool in serve:
        _, batch = series(dec, "batch", None, pool=pool)
        assert batch.max() > 1.4 * np.median(batch)  # bursts really raise the batch


def _level_shift(resid: np.ndarray, margin: int = 6) -> float:
    """Largest difference of means left and right of any split point."""
    c = np.cumsum(resid)
    n = len(resid)
    best = 0.0
    for s in range(margin, n - margin):
        left = c[s - 1] / s
        right = (c[-1] - c[s - 1]) / (n - s)
        best = max(best, abs(left - right))
    return best


@pytest.mark.parametrize("name", HEALTHY)
def test_no_level_shift_once_load_is_accounted_for(scenario_run: RunCache, name: str) -> None:
    """MFU and stall move with the batch (load) but show no step once the batch is regressed out."""
    sim, dec = scenario_run(name)
    for pool in sim.labels["pools"]:
        ts_b, batch = series(dec, "batch", None, pool=pool["name"])
        for layer in pool["layers"]:
            if layer == "allreduce":
                continue  # sync waits follow stragglers, not load
            for metric in ("mfu", "stall_frac"):
                ts, y = series(dec, metric, layer, pool=pool["name"])
                assert np.array_equal(ts, ts_b)
                x = np.log(batch)
                if np.ptp(x) > 0.05:
                    fit = np.polyval(np.polyfit(x, np.log(y), 2), x)
                    resid = np.log(y) - fit
                else:
                    resid = np.log(y) - np.log(y).mean()
                shift = _level_shift(resid)
                assert shift < 0.01, f"{name} {pool['name']} {layer} {metric}: shift {shift:.4f}"


def test_bursts_raise_mfu_of_healthy_serving_devices(scenario_run: RunCache) -> None:
    """Load-dependent MFU: memory-bound decode GEMMs gain MFU as bursts grow the batch."""
    _, dec = scenario_run("healthy_with_bursts")
    _, batch = series(dec, "batch", None, pool="serve-a")
    _, mfu = series(dec, "mfu", "mlp", pool="serve-a")
    assert np.corrcoef(np.log(batch), mfu)[0, 1] > 0.9
    hi = batch > np.quantile(batch, 0.95)
    lo = batch < np.quantile(batch, 0.5)
    assert mfu[hi].mean() > 1.2 * mfu[lo].mean()
