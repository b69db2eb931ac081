"""The daemon loop: source → pipeline → sinks, then commit (at-least-once)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from monitor.core.pipeline import Pipeline
from monitor.core.types import DeadLetter, RawMessage
from monitor.log import get_logger
from monitor.sinks.base import Sink
from monitor.sources.base import Source
from monitor.wire import Alert

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from monitor.checkpoint import Checkpointer


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
    # Kafka only: stores detector state after sinks ack, before the commit, and at stop.
    checkpointer: Checkpointer | None = None
    # Live sources: the wall clock that bounds event time from above (`Pipeline.process`).
    wall_clock: Callable[[], float] | None = None
    # Read by the metrics collector at scrape time; updated once per batch, not per record.
    sent: Counter[tuple[str, str]] = field(default_factory=Counter)  # (sink, status)
    send_errors: Counter[str] = field(default_factory=Counter)
    firing: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (severity, scope)

    async def run(self) -> None:
        """Process batches; sinks acknowledge before the source commits."""
        log = get_logger("runner")
        batches = self.source.batches()
        try:
            async for batch in batches:
                await self._hand_over()
                if batch:
                    await self._process(batch, log)
                elif self.stop_when_idle is not None and self.stop_when_idle():
                    break
                if self.stop.is_set():
                    break
            # Clean stop: everything delivered was processed, acknowledged and committed.
            if self.checkpointer is not None:
                await self.checkpointer.save()
        finally:
            # Release the batch (and the source's rebalance lock) before the source closes.
            aclose = getattr(batches, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _send(self, alerts: list[Alert]) -> None:
        """Every sink gets the batch's alerts, in order; counted per sink and status."""
        statuses = Counter(a.status for a in alerts)
        for sink in self.sinks:
            name = sink_name(sink)
            try:
                await sink.send(alerts)
            except Exception:
                self.send_errors[name] += 1
                raise
            for status, n in statuses.items():
                self.sent[name, status] += n
        _track(self.firing, alerts)

    async def _hand_over(self) -> None:
        """Tell the sinks which alerts this member gave up in a rebalance: their new owner
        keeps them alive now (a sink without `forget` has nothing to keep alive)."""
        ids, self.pipeline.handed_over = self.pipeline.handed_over, []
        if not ids:
            return
        for sink in self.sinks:
            forget = getattr(sink, "forget", None)
            if forget is not None:
                forget(ids)
        for aid in ids:
            self.firing.pop(aid, None)

    async def _process(self, batch: list[RawMessage], log: FilteringBoundLogger) -> None:
        out = self.pipeline.process(batch, self.wall_clock() if self.wall_clock else None)
        if out.alerts:
            await self._send(out.alerts)
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
        if self.checkpointer is not None and self.checkpointer.due():
            await self.checkpointer.save()
        await self.source.commit()


def _track(firing: dict[str, tuple[str, str]], alerts: Sequence[Alert]) -> None:
    """Keep the firing alerts' severity and scope for /metrics."""
    for a in alerts:
        if a.status == "firing":
            firing[a.id] = (a.severity, a.scope.level)
        else:
            firing.pop(a.id, None)


def sink_name(sink: Sink) -> str:
    """A short label for a sink: its `name` attribute, else its class name less "Sink"."""
    name = getattr(sink, "name", None)
    if isinstance(name, str) and name:
        return name
    return type(sink).__name__.removesuffix("Sink").lower() or "sink"
