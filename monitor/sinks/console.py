"""One readable line per alert, for a terminal (`flopwatch up`) or a log."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from monitor.core.coverage import where
from monitor.wire import Alert


def alert_text(a: Alert, link_base: str | None = None) -> str:
    """A one-line human summary of an alert; with `link_base`, its incident page's URL last."""
    s = a.suggestion
    step = f"rollback {s.change_id} ({s.kind} {s.from_}->{s.to})" if s.change_id else s.action
    link = f" | {link_base.rstrip('/')}/alerts/{a.id}" if link_base else ""
    n = a.scope.device_count
    blind = ", ".join(
        i.stage + (f" ({i.devices}/{n} devices)" if where(i, n) else "") for i in a.not_judged
    )
    return (
        f"[{a.status.upper():8}] {a.severity:6} {a.id} {a.summary} | first failing stage: "
        f"{a.first_failing_stage} ({a.bottleneck}){' | not judged: ' + blind if blind else ''}"
        f" | next: {step} | {a.runbook}{link}"
    )


class ConsoleSink:
    """Prints one readable line per alert (linking to its page where one is served)."""

    def __init__(self, stream: TextIO | None = None, link_base: str | None = None) -> None:
        self._out = stream or sys.stdout
        # The daemon's external URL (`sinks.alertmanager.external_url`), as Alertmanager's
        # generatorURL: the incident page is <link_base>/alerts/<id>.
        self.link_base = link_base

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Print and flush."""
        for a in alerts:
            print(alert_text(a, self.link_base), file=self._out)
        self._out.flush()

    async def close(self) -> None:
        """Nothing to release."""
