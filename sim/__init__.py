"""Vectorised accelerator-fleet simulator that emits contract window records and change events."""

from sim.run import Simulation, SimWindow, simulate
from sim.scenarios import SCENARIOS, Scenario, UnknownScenario

__all__ = ["SCENARIOS", "Scenario", "SimWindow", "Simulation", "UnknownScenario", "simulate"]
