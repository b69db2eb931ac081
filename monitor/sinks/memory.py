"""An in-memory sink: keeps every alert it was sent (replays in tests and benchmarks)."""

from __future__ import annotations

from collections.abc import Sequence

from monitor.wire import Alert


class ListSink:
    """Keeps every alert it was sent, in order."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []
        self.forgotten: list[str] = []  # alert ids handed over to another member

    def forget(self, ids: Sequence[str]) -> None:
        """Note alerts another member keeps alive now."""
        self.forgotten.extend(ids)

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Append the batch."""
        self.alerts.extend(alerts)

    async def close(self) -> None:
        """Nothing to release."""
        return
