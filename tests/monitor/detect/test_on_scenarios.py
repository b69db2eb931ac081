"""The engine on the simulator's scenarios, stream by stream: the faulty streams fire, the
rest stay below the daemon's materiality floors (load-aware, as the daemon runs it)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from bench.detect import _scenario
from sim.labels import frame_indicator
from sim.run import simulate

METRICS = ("mfu", "stall_frac")


@cache
def run(name: str) -> dict[str, Any]:
    """Per-stream results of one scenario at 128 devices (seed 1), raw and load-aware."""
    sim = simulate(name, devices=128, seed=1)
    result: dict[str, Any] = _scenario(sim, frame_indicator, METRICS)
    return result


def incidents(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-incident scores of one input kind."""
    return [v for v in entry.values() if isinstance(v, dict)]


@pytest.mark.parametrize("name", ["pool_regression", "kernel_fallback", "burst_only_regression"])
def test_the_faulty_streams_fire_and_no_other_stream_reports(name: str) -> None:
    """At least 95% of the labelled (device, layer, metric) streams report a material change
    after the onset; no stream outside the faults' (device, layer) scope does."""
    aware = run(name)["load_aware"]
    scores = incidents(aware)
    assert scores
    for inc in scores:
        assert inc["recall_material"] >= 0.95, inc
        assert inc["delay_median_windows"] is not None
    assert aware["false_material"] == 0


def test_a_burst_only_regression_needs_load_awareness() -> None:
    """Judged raw, bursts hide most of a regression that shows only under burst load."""
    res = run("burst_only_regression")
    raw, aware = incidents(res["raw"]), incidents(res["load_aware"])
    assert max(i["recall"] for i in raw) < 0.5
    assert min(i["recall_material"] for i in aware) >= 0.95


@pytest.mark.parametrize("name", ["healthy_with_bursts", "deploy_without_regression"])
def test_healthy_scenarios_stay_within_the_per_stream_budget(name: str) -> None:
    """Bursts, diurnal load and harmless deploys: material change points stay under the
    1 per 1e5 stream-windows budget load-aware, against hundreds per 1e5 judged raw."""
    res = run(name)
    assert res["load_aware"]["false_material_per_1e5"] <= 1.0
    assert res["raw"]["false_material_per_1e5"] >= 50.0
