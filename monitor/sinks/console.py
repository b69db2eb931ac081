"""One readable line per alert, for a terminal (`flopwatch up`) or a log."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from monitor.wire import Alert


def alert_text(a: Alert) -> str:
    """A one-line human summary of an alert."""
    s = a.suggestion
    step = f"rollback {s.change_id} ({s.kind} {s.from_}->{s.to})" if s.change_id else s.action
    return (
        f"[{a.status.upper():8}] {a.severity:6} {a.id} {a.summary} | first failing stage: "
        f"{a.first_failing_stage} ({a.bottleneck}) | next: {step} | {a.runbook}"
    )


class ConsoleSink:
    """Prints one readable line per alert."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._out = stream or sys.stdout

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Print and flush."""
        for a in alerts:
            print(alert_text(a), file=self._out)
        self._out.flush()

    async def close(self) -> None:
        """Nothing to release."""
