"""The wide pack: overload physics, NIC slowdown, sampled quality, mixed hardware, joining hosts,
model swaps, and physics drawn per seed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from sim.faults import NicSlowdown
from sim.fleet import Fleet, PoolSpec
from sim.physics import DUTY_CAP, Frame, NoiseSpec, Physics
from sim.run import DEFAULT_START_TS, Simulation, simulate
from sim.testing import Decoded, series, span_mean
from sim.traffic import Burst, TrafficSpec

RunCache = Callable[[str], tuple[Simulation, Decoded]]
W = 10.0


def _serving(traffic: TrafficSpec, devices: int = 16) -> tuple[Fleet, list[Frame]]:
    """Noise-free frames of one llama-8b serving pool over 100 windows."""
    fleet = Fleet([PoolSpec("s", "llama-8b/serve", "v1", traffic=traffic)], devices)
    phys = Physics(fleet, [], NoiseSpec.off(), seed=0, window_s=W, start_ts=DEFAULT_START_TS)
    return fleet, [phys.step(k) for k in range(100)]


def test_overload_pins_the_batch_builds_a_backlog_and_sheds() -> None:
    """Load 1.2x capacity: batch at its cap, queue wait grows window after window until the
    admission limit, then requests are shed (errors); none of it before the burst."""
    s = DEFAULT_START_TS
    burst = Burst(s + 300.0, s + 800.0, 1.8)  # headroom 1.5: load 1.2x capacity
    fleet, frames = _serving(TrafficSpec(headroom=1.5, max_queue_s=20.0, bursts=(burst,)))
    calm = frames[:30]
    hot = [f for f in frames if f.in_burst[0]]
    assert all(f.errors[0] < 1.0 for f in calm)
    assert all(f.batch[0] < 0.8 * fleet.dev["max_batch"][0] for f in calm)
    assert all(f.batch[0] == fleet.dev["max_batch"][0] for f in hot)
    waits = np.array([f.queue_wait_ms[0] for f in hot])
    rising = np.diff(waits[:8])
    assert (rising > 0).all(), waits[:8]  # the backlog carries over from window to window
    assert waits.max() > 20 * calm[-1].queue_wait_ms[0]
    assert waits.max() <= 20_000.0 + 1e3  # bounded by the admission limit
    shed = [f.errors[0] >= 1.0 for f in hot]
    assert not shed[0]
    assert any(shed)  # shedding starts once the backlog reaches the limit
    after = frames[85:]
    assert all(f.errors[0] < 1.0 for f in after)  # the backlog drains once the burst ends
    p99 = np.array([f.p99[0] for f in hot])
    assert p99.max() > 1.2 * calm[-1].p99[0]


def test_waiting_grows_like_rho_over_one_minus_rho() -> None:
    """Below capacity the admission wait is half a step times 1/(1-rho)."""
    got = []
    for head in (4.0, 2.0, 1.25):
        _, frames = _serving(TrafficSpec(headroom=head))
        f = frames[50]
        rho = (f.busy_s[0].sum() / W) / DUTY_CAP
        half_step = f.queue_wait_ms[0] * (1.0 - rho)
        got.append((rho, f.queue_wait_ms[0], half_step))
        assert f.errors[0] < 1.0
    rhos = [g[0] for g in got]
    assert rhos[0] < rhos[1] < rhos[2] < 1.0
    # the same half step explains all three waits: the wait is not linear in the load
    assert got[0][2] == pytest.approx(got[2][2], rel=0.15)
    ratio = got[2][1] / got[0][1]
    assert ratio == pytest.approx((1.0 - rhos[0]) / (1.0 - rhos[2]), rel=0.15)
    assert ratio > 1.5 * rhos[2] / rhos[0]  # faster than the utilisation itself


def test_classic_pools_keep_their_queue_model() -> None:
    """A pool without headroom keeps half a tick of wait and no shedding in a 2.4x burst."""
    s = DEFAULT_START_TS
    _, frames = _serving(TrafficSpec(bursts=(Burst(s + 300.0, s + 800.0, 2.4),)))
    assert {round(f.queue_wait_ms[0], 6) for f in frames} == {25.0}
    assert all(f.errors[0] < 1.0 for f in frames)


def test_nic_slowdown_multiplies_that_hosts_sync_wait_only() -> None:
    """Noise-free: the slowed host's wait per step is `factor` times as long; others unchanged."""
    fleet = Fleet([PoolSpec("t", "llama-70b/train", "v1")], 24)
    a = fleet.layer_col("allreduce")
    host0 = fleet.host_devices(0)
    slow = NicSlowdown(onset_ts=DEFAULT_START_TS, devices=host0, end_ts=None, factor=2.5)

    def frame(effects: list[NicSlowdown]) -> Frame:
        p = Physics(fleet, list(effects), NoiseSpec.off(), seed=0, window_s=W,
                    start_ts=DEFAULT_START_TS)  # fmt: skip
        return p.step(3)

    base, hit = frame([]), frame([slow])
    # wait over transfer time, per step: sync / (busy - sync)
    ratio_base = base.sync[:, a] / (base.busy_s[:, a] - base.sync[:, a])
    ratio_hit = hit.sync[:, a] / (hit.busy_s[:, a] - hit.sync[:, a])
    others = np.setdiff1d(np.arange(fleet.n), host0)
    np.testing.assert_allclose(ratio_hit[host0] / ratio_base[host0], 2.5, rtol=1e-9)
    np.testing.assert_allclose(hit.sync[others, a], base.sync[others, a], rtol=1e-12)
    assert (hit.flops[host0].sum(axis=1) < base.flops[host0].sum(axis=1)).all()  # fewer steps


def test_nic_slowdown_scenario_labels(scenario_run: RunCache) -> None:
    """Host scope, execution, no change; the sync fraction roughly doubles or more."""
    sim, _ = scenario_run("nic_slowdown")
    (inc,) = sim.labels["incidents"]
    assert (inc["scope"]["level"], inc["first_failing_stage"], inc["change_id"]) == (
        "host",
        "execution",
        None,
    )
    assert inc["scope"]["device_count"] == 8
    sync = next(i for i in inc["indicators"] if i["name"] == "sync_frac")
    assert sync["after"] > 1.3 * sync["before"]
    assert sim.labels["changes"] == []


def test_error_rise_fails_a_share_of_requests_outright(scenario_run: RunCache) -> None:
    """After a model change, 0.3-2 % of the pool's requests fail (from 0.002 %) and are
    counted in `slo.errors`; the answers that succeed are as good as before."""
    sim, dec = scenario_run("error_rise")
    (inc,) = sim.labels["incidents"]
    rate = inc["indicators"][0]
    assert rate["name"] == "error_rate"
    assert rate["before"] < 1e-3
    assert 0.002 < rate["after"] < 0.03
    change = next(c for c in sim.labels["changes"] if c["id"] == inc["change_id"])
    assert change["kind"] == "model"
    assert inc["first_failing_stage"] == "validation"
    scope = set(inc["scope"]["devices"])
    onset = inc["onset_ts"]
    failed = served = 0.0
    for ts in dec.ts:
        if ts <= onset + 60.0:
            continue
        for r in dec.records[ts]:
            if r.device in scope and r.slo is not None and r.ingress is not None:
                failed += r.slo.errors or 0.0
                served += (r.ingress.req_rate or 0.0) * r.window_s
    assert failed / served == pytest.approx(rate["after"], rel=0.5)


def test_quality_drop_is_a_tenfold_error_rate(scenario_run: RunCache) -> None:
    """0.999 -> 0.990 on the pool's requests, after a model change; the rollback is that change."""
    sim, dec = scenario_run("quality_drop")
    (inc,) = sim.labels["incidents"]
    q = inc["indicators"][0]
    assert q["name"] == "quality"
    assert q["before"] == pytest.approx(0.999, abs=4e-4)
    assert q["after"] == pytest.approx(0.990, abs=1e-3)
    assert 5.0 < (1 - q["after"]) / (1 - q["before"]) < 20.0
    change = next(c for c in sim.labels["changes"] if c["id"] == inc["change_id"])
    assert change["kind"] == "model"
    assert inc["first_failing_stage"] == "validation"
    # per device and window, quality is a share of that window's requests: mostly exactly 1
    scope = set(inc["scope"]["devices"])
    vals = [r.slo.quality for ts in dec.ts[:20] for r in dec.records[ts] if r.device in scope]
    assert np.mean([v == 1.0 for v in vals]) > 0.3


def test_small_thermal_throttle(scenario_run: RunCache) -> None:
    """One or two devices, no change event: clock and MLP MFU down 10-25%, temperature up."""
    sim, _ = scenario_run("thermal_small")
    (inc,) = sim.labels["incidents"]
    assert inc["scope"]["level"] == "device"
    assert 1 <= inc["scope"]["device_count"] <= 2
    assert inc["change_id"] is None
    moved = {i["name"]: i["delta_pct"] for i in inc["indicators"]}
    assert -25.0 < moved["clock_mhz"] < -10.0
    assert -25.0 < moved["mfu"] < -8.0
    assert moved["temp_c"] > 10.0


def test_fallback_lands_inside_an_overload(scenario_run: RunCache) -> None:
    """At the fallback's onset the pool is in a burst above capacity: batch at its cap, requests
    shed in the baseline already; the incident is its own, with its kernel_lib rollback."""
    sim, dec = scenario_run("fallback_in_overload")
    (inc,) = sim.labels["incidents"]
    assert inc["context"] == "overload"
    assert inc["first_failing_stage"] == "lowering"
    change = next(c for c in sim.labels["changes"] if c["id"] == inc["change_id"])
    assert change["kind"] == "kernel_lib"
    pool = inc["scope"]["pool"]
    (burst,) = next(p for p in sim.labels["pools"] if p["name"] == pool)["bursts"]
    assert burst[0] < inc["baseline"][0]
    assert inc["effect"][1] <= burst[1]
    ts, batch = series(dec, "batch", None, pool=pool)
    assert span_mean(ts, batch, inc["baseline"]) == pytest.approx(256.0)
    ts, err = series(dec, "errors", None, pool=pool)
    assert span_mean(ts, err, inc["baseline"]) > 1.0
    assert span_mean(ts, err, inc["effect"]) > span_mean(ts, err, inc["baseline"])


def test_healthy_wide_scenarios(scenario_run: RunCache) -> None:
    """No incidents; overload sheds requests in some window; a model swap moves the model."""
    for name in ("overload_bursts", "mixed_joins", "healthy_fleet"):
        sim, dec = scenario_run(name)
        assert sim.labels["incidents"] == []
        serve = [p["name"] for p in sim.labels["pools"] if p["mode"] == "serve"]
        shed = [series(dec, "errors", None, pool=p)[1].max() for p in serve]
        assert max(shed) > 1.0, name
    sim, dec = scenario_run("model_swap")
    assert sim.labels["incidents"] == []
    (swap,) = [c for c in sim.labels["changes"] if c["kind"] == "model"]
    models = {r.model for ts in dec.ts if ts > swap["ts"] + sim.window_s for r in dec.records[ts]
              if r.pool == "serve-a"}  # fmt: skip
    assert models == {swap["to"]}
    ts, attn = series(dec, "mfu", "attention", pool="serve-a")
    _, batch = series(dec, "batch", None, pool="serve-a")
    calm = batch < np.quantile(batch, 0.6)  # compare at like load: outside bursts
    before = attn[calm & (ts < swap["ts"])].mean()
    after = attn[calm & (ts > swap["ts"] + 2 * sim.window_s)].mean()
    assert abs(after / before - 1.0) > 0.05  # a level shift that the change event explains


def test_mixed_hardware_and_joining_hosts(scenario_run: RunCache) -> None:
    """serve-mix reports A100 and H100 devices; joining hosts report from their join on, and
    the pool's load spreads over them."""
    sim, dec = scenario_run("mixed_joins")
    pool = next(p for p in sim.labels["pools"] if p["name"] == "serve-mix")
    assert set(pool["hw_mix"]) == {"a100-sxm", "h100-sxm"}
    hws = {r.hw for r in dec.records[dec.ts[-1]] if r.pool == "serve-mix"}
    assert hws == {"a100-sxm", "h100-sxm"}
    join = next(j for j in sim.labels["joins"] if j["pool"] == "serve-mix")
    late = {r.device for ts in dec.ts if ts <= join["ts"] for r in dec.records[ts]
            if r.host in set(join["hosts"])}  # fmt: skip
    assert late == set()
    first = {r.device for r in dec.records[dec.ts[-1]] if r.host in set(join["hosts"])}
    assert len(first) == join["devices"]
    old = {r.device for r in dec.records[dec.ts[0]] if r.pool == "serve-mix"}
    ts, rate = series(dec, "req_rate", None, devices=old)
    n_old, n_new = len(old), len(old) + join["devices"]
    w = sim.window_s
    before = span_mean(ts, rate, (join["ts"] - 6 * w, join["ts"]))
    after = span_mean(ts, rate, (join["ts"], join["ts"] + 6 * w))
    assert after / before == pytest.approx(n_old / n_new, rel=0.1)


def test_seeds_draw_different_physics() -> None:
    """Wide runs draw noise, traffic, headroom and pool sizes per seed over wide ranges; classic
    runs keep theirs whatever the seed."""
    plans = [simulate("overload_bursts", devices=128, seed=s) for s in range(12)]  # no physics yet
    noise = [p.plan.noise for p in plans]
    white = [n.white_sigma for n in noise]
    assert max(white) / min(white) > 2.0
    assert min(n.tail for n in noise) < 0.5
    assert max(n.tail for n in noise) > 1.2
    phis = [n.wander_phi for n in noise]
    assert max(phis) - min(phis) > 0.08
    heads = [p.fleet.pools[0].traffic.headroom or 0.0 for p in plans]
    assert max(heads) / min(heads) > 1.15
    sizes = {tuple(len(p.fleet.pool_devices(x.name)) for x in p.fleet.pools) for p in plans}
    assert len(sizes) > 3
    bursts = {len(p.fleet.pools[0].traffic.bursts) for p in plans}
    assert len(bursts) > 1
    classic = [simulate("healthy_with_bursts", duration_s=60.0, seed=s) for s in (1, 2)]
    assert classic[0].plan.noise == classic[1].plan.noise
    widened = simulate("healthy_with_bursts", duration_s=60.0, seed=1, wide=True)
    assert widened.plan.noise != classic[0].plan.noise
    assert widened.labels["wide"] is True
