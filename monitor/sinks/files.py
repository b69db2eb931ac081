"""File-like sinks: JSONL alert records (replay's output) and one readable line per alert."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import msgspec

from monitor.wire import Alert

_enc = msgspec.json.Encoder(order="deterministic")


def alert_line(alert: Alert) -> bytes:
    """One alert as a compact JSON line (stable key order: byte-identical replays)."""
    return _enc.encode(alert) + b"\n"


class JsonlSink:
    """Appends alert records as JSON lines to a file or to stdout."""

    def __init__(self, path: Path | None = None) -> None:
        self._own = path is not None
        self._f = path.open("wb") if path is not None else sys.stdout.buffer

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Write and flush."""
        for a in alerts:
            self._f.write(alert_line(a))
        self._f.flush()

    async def close(self) -> None:
        """Close the file (never stdout)."""
        if self._own:
            self._f.close()


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
