"""The live incident pages: what the daemon sent and the levels it kept, as HTML.

Read-only and bounded: the newest record of the last `max_incidents` alert ids the
runner delivered, the series keeper's recent history, the change events the advisor
holds, and the stream tables' hosts. Nothing is stored for the pages alone beyond that.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence

from monitor.core.pipeline import Pipeline
from monitor.report.render import IncidentView, incident_html, index_html
from monitor.report.series import SeriesKeeper
from monitor.wire import Alert, ChangeEvent

REFRESH_S = 30  # the pages reload themselves this often (no script)


class LivePages:
    """The `/alerts` pages of one daemon (`HttpServer(pages=...)`)."""

    def __init__(self, pipeline: Pipeline, keeper: SeriesKeeper, max_incidents: int = 200) -> None:
        self.pipeline = pipeline
        self.keeper = keeper
        self.max_incidents = max_incidents
        self._views: OrderedDict[str, IncidentView] = OrderedDict()

    def sent(self, alerts: Sequence[Alert]) -> None:
        """Take the records the runner delivered (`Runner.on_sent`)."""
        for a in alerts:
            old = self._views.pop(a.id, None)
            resolved = a.ts if a.status == "resolved" else None
            if old is None:
                self._views[a.id] = IncidentView(a, a.ts, resolved, 1)
            else:
                self._views[a.id] = IncidentView(a, old.first_ts, resolved, old.records + 1)
            if a.status == "firing":
                self.keeper.watch(a)
        while len(self._views) > self.max_incidents:
            gone, _ = self._views.popitem(last=False)
            self.keeper.forget(gone)

    def _full(self, v: IncidentView) -> IncidentView:
        a = v.alert
        return dataclasses.replace(
            v, series=self.keeper.series(a), hosts=self.keeper.hosts(a.scope.hosts)
        )

    def _changes(self, v: IncidentView) -> list[ChangeEvent]:
        """Changes of the plotted span, and the one the suggestion rolls back."""
        a = v.alert
        s = self.keeper.series(a)
        start = min([a.onset_ts, *s.ts[:1], *s.pool_ts[:1]])
        return [
            c
            for c in self.pipeline.advisor.changes
            if c.id == a.suggestion.change_id or start <= c.ts <= a.ts
        ]

    def index(self) -> str:
        """The list of open and recent incidents."""
        return index_html(list(self._views.values()), REFRESH_S)

    def page(self, alert_id: str) -> str | None:
        """One incident's page, or None for an id this daemon does not hold."""
        v = self._views.get(alert_id)
        if v is None:
            return None
        return incident_html(self._full(v), self._changes(v), REFRESH_S)
