"""The runner loop: sinks before commit, one warning per unknown-hardware device."""

from __future__ import annotations

from collections.abc import AsyncIterator

from factories import T0, fleet, msg, window
from structlog.testing import capture_logs

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.daemon.runner import Runner


class ListSource:
    """Yields fixed batches and records when it was asked to commit."""

    def __init__(self, batches: list[list[RawMessage]], log: list[str]) -> None:
        self._batches = batches
        self.log = log

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        for b in self._batches:
            self.log.append("batch")
            yield b

    async def commit(self) -> None:
        self.log.append("commit")

    async def close(self) -> None:
        return None


class ListSink:
    """Records each send in the shared log."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def send(self, alerts) -> None:
        self.log.append(f"send {len(alerts)}")

    async def close(self) -> None:
        return None


async def test_unknown_hardware_warned_once_per_device() -> None:
    """Ten windows of two mystery devices give exactly two warnings, naming each device."""
    batches = [
        [msg(window(f"n/gpu{d}", T0 + 10 * w, hw="mystery-9000")) for d in range(2)]
        for w in range(10)
    ]
    events: list[str] = []
    with capture_logs() as logs:
        await Runner(ListSource(batches, events), Pipeline(Settings()), []).run()
    warnings = [e for e in logs if e["event"].startswith("unknown hardware")]
    assert sorted(e["device"] for e in warnings) == ["n/gpu0", "n/gpu1"]
    assert all(e["hw"] == "mystery-9000" for e in warnings)
    assert events.count("commit") == 10


async def test_commit_only_after_sinks_took_the_alerts() -> None:
    """At-least-once: a batch that produced alerts is committed after every sink sent them."""
    events: list[str] = []
    batches = fleet(70, regress_at=40, change_at=39)
    await Runner(ListSource(batches, events), Pipeline(Settings()), [ListSink(events)]).run()
    sends = [i for i, e in enumerate(events) if e.startswith("send")]
    assert sends
    for i in sends:
        # batch -> send -> commit: the offset moves only once the sink has the alerts.
        assert events[i - 1 : i + 2] == ["batch", events[i], "commit"]
