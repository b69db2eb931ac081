"""JSONL alert records: replay's output, and the bytes every sink that writes JSON uses."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

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
