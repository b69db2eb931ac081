"""In-process simulator source: the simulator's windows as batches, no broker in between."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from monitor.config import Topics
from monitor.core.types import RawMessage
from monitor.sources.recording import numbered

if TYPE_CHECKING:
    from sim.run import Simulation


class SimulatorSource:
    """Yields one batch per simulated window; partitions by device key like Kafka would."""

    def __init__(
        self,
        simulation: Simulation,
        topics: Topics,
        partitions: int = 1,
        speed: float | None = None,
    ) -> None:
        self.simulation = simulation
        self.topics = topics
        self.partitions = partitions
        self.speed = speed  # event-time speed-up; None = as fast as possible

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        """Change events first (they land before the window ends), then window records."""
        offset = 0
        window_s = float(self.simulation.labels["window_s"])
        for w in self.simulation.windows():
            if self.speed is not None:
                await asyncio.sleep(window_s / self.speed)
            batch = [RawMessage(self.topics.changes, 0, -1, k, v) for k, v in w.changes]
            for key, value in w.records:
                part = zlib.crc32(key) % self.partitions
                batch.append(RawMessage(self.topics.samples, part, offset, key, value))
                offset += 1
            yield batch

    async def commit(self) -> None:
        """Nothing to acknowledge in process."""

    async def close(self) -> None:
        """Nothing to release."""


def simulation(
    scenario: str, *, devices: int | None, duration_s: float | None, seed: int, window_s: float
) -> Simulation:
    """A configured scenario run; ValueError (with the scenario list) for a bad one."""
    from sim.run import simulate  # noqa: PLC0415 - the simulator loads only when asked for

    try:
        return simulate(
            scenario, devices=devices, duration_s=duration_s, seed=seed, window_s=window_s
        )
    except KeyError as exc:  # UnknownScenario: its str() lists the known ones
        raise ValueError(str(exc)) from None


def simulation_lines(sim: Simulation) -> Iterator[tuple[int, bytes]]:
    """The lines `flopwatch sim --out` writes for `sim`, numbered as in that file."""
    return numbered(line for w in sim.windows() for line in w.lines())
