"""Diagnosis over the simulator's scenario pack, per scenario (fleet_day runs in bench/)."""

from __future__ import annotations

import asyncio

import pytest

from bench.diagnose import run_scenario
from monitor.config import Settings

REGRESSIONS = [
    "pool_regression", "kernel_fallback", "tiling_regression", "memory_placement",
    "sync_contention", "thermal_throttle", "burst_only_regression", "ingress_queueing",
    "quality_regression",
]  # fmt: skip
HEALTHY = ["healthy_with_bursts", "deploy_without_regression"]


# About three minutes at 128 devices: `make test-slow` and CI run it; `make test` has the
# same nine scenarios at 48 devices in the golden replay (tests/test_replay_golden.py).
@pytest.mark.slow
@pytest.mark.parametrize("name", REGRESSIONS)
def test_incident_found_attributed_and_rolled_back(name: str) -> None:
    """One alert per labelled incident, right first failing stage and rollback, no extras."""
    res, alerts = asyncio.run(run_scenario(name, 128, 1, Settings(), tolerance=6.0))
    assert res.found == res.incidents == 1, res.misses
    assert res.duplicate_alerts == 0
    assert res.stage_ok == 1, [(a.first_failing_stage, a.bottleneck) for a in alerts]
    assert res.rollback_ok == 1, [a.suggestion for a in alerts][-1:]
    assert res.after_onset_suggestions == 0
    assert res.false_incidents == 0, res.false
    assert res.resolved_early == 0


# About 30 s at 128 devices: `make test-slow` and CI run it; `make test` replays both at 48
# devices in the golden replay, whose alert lists for them are empty.
@pytest.mark.slow
@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_scenarios_never_page(name: str) -> None:
    """Bursts, diurnal load and harmless deploys produce no alert at all."""
    res, alerts = asyncio.run(run_scenario(name, 128, 1, Settings(), tolerance=6.0))
    assert alerts == [], [a.summary for a in alerts]
    assert res.false_incidents == 0
