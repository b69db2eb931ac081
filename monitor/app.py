"""The daemon loop: source → pipeline → sinks, then commit (at-least-once)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from monitor.logging import get_logger
from monitor.pipeline import DeadLetter, Pipeline
from monitor.sinks.base import Sink
from monitor.sources.base import Source


@dataclass
class Runner:
    """Drives one source through the pipeline into the sinks until the source ends or stop."""

    source: Source
    pipeline: Pipeline
    sinks: Sequence[Sink]
    dead_letters: Callable[[Sequence[DeadLetter]], Awaitable[None]] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # Stop once the source is idle (an empty poll) and this returns True.
    stop_when_idle: Callable[[], bool] | None = None
    rejected: Counter[str] = field(default_factory=Counter)

    async def run(self) -> None:
        """Process batches; sinks acknowledge before the source commits."""
        log = get_logger("runner")
        async for batch in self.source.batches():
            if batch:
                out = self.pipeline.process(batch)
                if out.alerts:
                    for sink in self.sinks:
                        await sink.send(out.alerts)
                if out.dead:
                    for d in out.dead:
                        self.rejected[d.reason.split(":")[0]] += 1
                        log.debug("rejected", reason=d.reason, partition=d.message.partition,
                                  offset=d.message.offset)  # fmt: skip
                    if self.dead_letters is not None:
                        await self.dead_letters(out.dead)
                for device, hw, dtype in self.pipeline.unknown_hw:
                    log.warning("unknown hardware: MFU not computed for this device",
                                device=device, hw=hw, dtype=dtype)  # fmt: skip
                self.pipeline.unknown_hw.clear()
                await self.source.commit()
            elif self.stop_when_idle is not None and self.stop_when_idle():
                break
            if self.stop.is_set():
                break
