"""The sink seam: something that takes alerts (and, for Kafka, dead letters)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from monitor.wire import Alert


class Sink(Protocol):
    """Takes alert records; `send` returns once they are durably handed over."""

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Deliver alerts in order."""
        ...

    async def close(self) -> None:
        """Flush and release resources."""
        ...
