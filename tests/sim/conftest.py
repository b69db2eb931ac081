"""Decoded scenario runs, shared by the simulator tests (each run is built once per session)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sim.run import Simulation, simulate
from sim.testing import Decoded, decode_run

# small but complete runs of every scenario: (devices, duration_s, window_s)
RUN_SIZES: dict[str, tuple[int, float, float]] = {
    "pool_regression": (64, 600.0, 10.0),
    "kernel_fallback": (64, 900.0, 10.0),
    "tiling_regression": (64, 900.0, 10.0),
    "memory_placement": (64, 900.0, 10.0),
    "sync_contention": (64, 900.0, 10.0),
    "thermal_throttle": (64, 900.0, 10.0),
    "burst_only_regression": (64, 3600.0, 20.0),
    "ingress_queueing": (64, 900.0, 10.0),
    "quality_regression": (64, 900.0, 10.0),
    "healthy_with_bursts": (64, 3600.0, 20.0),
    "deploy_without_regression": (64, 3600.0, 20.0),
    "fleet_day": (80, 3 * 3600.0, 30.0),
    "dirty_stream": (64, 600.0, 10.0),
    "overload_bursts": (64, 3600.0, 20.0),
    "nic_slowdown": (64, 900.0, 10.0),
    "quality_drop": (64, 900.0, 10.0),
    "error_rise": (64, 900.0, 10.0),
    "thermal_small": (64, 900.0, 10.0),
    "fallback_in_overload": (64, 900.0, 10.0),
    "model_swap": (64, 3600.0, 20.0),
    "mixed_joins": (64, 3600.0, 20.0),
    "healthy_fleet": (64, 2 * 3600.0, 30.0),
}

RunCache = Callable[[str], tuple[Simulation, Decoded]]


@pytest.fixture(scope="session")
def run_sizes() -> dict[str, tuple[int, float, float]]:
    """The (devices, duration_s, window_s) each scenario is tested at."""
    return dict(RUN_SIZES)


@pytest.fixture(scope="session")
def scenario_run() -> RunCache:
    """scenario name -> (simulation, decoded records), built on first use with seed 5."""
    cache: dict[str, tuple[Simulation, Decoded]] = {}

    def get(name: str) -> tuple[Simulation, Decoded]:
        if name not in cache:
            devices, duration, window = RUN_SIZES[name]
            s = simulate(name, devices=devices, duration_s=duration, seed=5, window_s=window)
            cache[name] = (s, decode_run(s) if name != "dirty_stream" else Decoded())
        return cache[name]

    return get
