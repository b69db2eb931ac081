"""The daemon loop: source → pipeline → sinks, then commit (at-least-once)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
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
    # Per sink (and "dlq"): monotonic time of the first failure of the delivery now retrying.
    failing_since: dict[str, float] = field(default_factory=dict)
    retry_s: float = 0.5  # first back-off of a failing sink; doubles up to 30 s
    # Told of every batch of alerts once all sinks took it (the live incident pages).
    on_sent: Callable[[Sequence[Alert]], None] | None = None
    # Clean stop: how long queued sinks (`flush`) may take to deliver before the last
    # checkpoint, which then records what they still owe.
    drain_s: float = 5.0
    # With `kafka.fleet_stage`: publishes one report of a batch to the change-point topic
    # (after the sinks took the batch's alerts, before the commit).
    publish_report: Callable[[bytes], Awaitable[None]] | None = None
    _adopted: set[str] = field(default_factory=set)  # alert ids whose delivery state was handed

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
            await self._drain(log)
            self._keep_delivery()
            if self.checkpointer is not None:
                await self.checkpointer.save()
        finally:
            # Release the batch (and the source's rebalance lock) before the source closes.
            aclose = getattr(batches, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _send(self, alerts: list[Alert], log: FilteringBoundLogger) -> None:
        """Every sink gets the batch's alerts, in order; counted per sink and status."""
        statuses = Counter(a.status for a in alerts)
        for sink in self.sinks:
            name = sink_name(sink)
            await self._deliver(name, partial(sink.send, alerts), log)
            for status, n in statuses.items():
                self.sent[name, status] += n
        _track(self.firing, alerts)
        self._keep_delivery()
        if self.on_sent is not None:
            try:
                self.on_sent(alerts)
            except Exception as exc:  # a page must never stop alerting
                log.exception("alert pages not updated", error=repr(exc))

    async def _drain(self, log: FilteringBoundLogger) -> None:
        """Give the queued sinks `drain_s` to deliver what they hold (all at once)."""
        flushes = [(sink_name(s), f) for s in self.sinks if (f := getattr(s, "flush", None))]
        if not flushes:
            return
        done = await asyncio.gather(*(f(self.drain_s) for _, f in flushes))
        left = [name for (name, _), ok in zip(flushes, done, strict=True) if not ok]
        if left:
            log.warning("stopping with undelivered alerts queued (kept in the checkpoint "
                        "where they end a page)", sinks=left)  # fmt: skip

    def _adopt_delivery(self) -> None:
        """Hand the sinks what restored alert states say is open at them (once per id)."""
        states = self.pipeline.alert_states()
        fresh = [aid for aid in states if aid not in self._adopted]
        if not fresh:
            return
        for sink in self.sinks:
            adopt = getattr(sink, "adopt", None)
            if adopt is None:
                continue
            name = sink_name(sink)
            for aid in fresh:
                entries = states[aid].delivery.get(name)
                if entries:
                    adopt(aid, entries)
        self._adopted.update(fresh)
        if len(self._adopted) > 2 * len(states) + 64:
            self._adopted &= set(states)

    def _keep_delivery(self) -> None:
        """Copy each sink's delivery state into the alert states the checkpoint writes."""
        states = self.pipeline.alert_states()
        for sink in self.sinks:
            delivery_state = getattr(sink, "delivery_state", None)
            if delivery_state is None:
                continue
            name, held = sink_name(sink), delivery_state()
            for aid, st in states.items():
                entries = held.get(aid)
                if entries:
                    st.delivery[name] = entries
                else:
                    st.delivery.pop(name, None)

    async def _deliver(
        self, name: str, call: Callable[[], Awaitable[None]], log: FilteringBoundLogger
    ) -> None:
        """Call until it succeeds, backing off; a failing sink never stops the daemon.

        Nothing is committed meanwhile (at-least-once), and `/readyz` fails once it has
        failed for `sinks.retry_budget_s`. Stopped while it still fails: raises, so the
        undelivered batch is neither checkpointed nor committed.
        """
        delay = self.retry_s
        while True:
            try:
                await call()
            except Exception as exc:
                self.send_errors[name] += 1
                first = self.failing_since.setdefault(name, time.monotonic())
                log.warning("sink failed, retrying", sink=name, error=f"{type(exc).__name__}: "
                            f"{exc}"[:300], failing_s=round(time.monotonic() - first, 1),
                            retry_in_s=delay)  # fmt: skip
                if self.stop.is_set():
                    raise
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), delay)
                delay = min(2 * delay, 30.0)
                continue
            if self.failing_since.pop(name, None) is not None:
                log.info("sink recovered", sink=name)
            return

    def sink_failing(self) -> dict[str, float]:
        """Seconds each failing sink (and "dlq") has failed so far; absent: delivering."""
        now = time.monotonic()
        since = dict(self.failing_since)
        for sink in self.sinks:
            probe = getattr(sink, "failing_since", None)
            t = probe() if callable(probe) else None
            if isinstance(t, float):
                name = sink_name(sink)
                since[name] = min(t, since.get(name, t))
        return {name: now - t for name, t in since.items()}

    def sink_failing_s(self) -> float:
        """How long the longest-failing sink has failed (0 when all deliver)."""
        return max(self.sink_failing().values(), default=0.0)

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
        self._adopted.difference_update(ids)

    async def _process(self, batch: list[RawMessage], log: FilteringBoundLogger) -> None:
        replaying = bool(getattr(self.source, "replaying", False))
        out = self.pipeline.process(batch, self.wall_clock() if self.wall_clock else None,
                                    replaying=replaying)  # fmt: skip
        for exc in self.pipeline.errors:
            log.error("internal error, isolated", error=f"{type(exc).__name__}: {exc}"[:300],
                      exc_info=exc)  # fmt: skip
        self.pipeline.errors.clear()
        self._adopt_delivery()
        if out.alerts:
            await self._send(out.alerts, log)
        if out.dead:
            for d in out.dead:
                self.rejected[d.reason.split(":")[0]] += 1
                log.debug("rejected", reason=d.reason, partition=d.message.partition,
                          offset=d.message.offset)  # fmt: skip
            if self.dead_letters is not None:
                send_dead, dead = self.dead_letters, out.dead
                await self._deliver("dlq", lambda: send_dead(dead), log)
        if out.reports:
            await self._publish(out.reports, log)
        for device, hw, dtype in self.pipeline.unknown_hw:
            log.warning("unknown hardware: MFU not computed for this device",
                        device=device, hw=hw, dtype=dtype)  # fmt: skip
        self.pipeline.unknown_hw.clear()
        if self.checkpointer is not None and self.checkpointer.due():
            self._keep_delivery()
            await self.checkpointer.save()
        await self.source.commit()

    async def _publish(self, reports: list[bytes], log: FilteringBoundLogger) -> None:
        """The batch's fleet-stage reports to the change-point topic, in order."""
        publish = self.publish_report
        if publish is None:
            return

        async def send() -> None:
            for report in reports:
                await publish(report)

        await self._deliver("change_points", send, log)


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
