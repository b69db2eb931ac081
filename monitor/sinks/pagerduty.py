"""PagerDuty Events API v2 sink: trigger and resolve one PagerDuty alert per flopwatch alert.

`dedup_key` is the alert id, so each re-sent or updated record updates the same
PagerDuty alert and the resolve closes it. The API answers 202 when it took an
event, 400 for an invalid one (not retried: logged and counted), 429 and 5xx
when it could not take it now (retried with backoff and jitter). An event is at
most 512 KB: evidence, then the host and device lists, are cut to fit.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin

from monitor.config import PagerDutySettings, mask_url
from monitor.core.coverage import describe
from monitor.errors import SinkError
from monitor.sinks.http import Http
from monitor.sinks.keyed import KeyedHttpSink
from monitor.sinks.queue import Item
from monitor.wire import Alert

SEVERITY = {"page": "critical", "ticket": "warning", "info": "info"}
_SUMMARY_MAX = 1024  # characters the API keeps of payload.summary
_DEDUP_MAX = 255  # characters of dedup_key


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def _details(a: Alert, evidence: int | None, devices: bool) -> dict[str, Any]:
    """custom_details: what on-call reads first, then the first `evidence` entries."""
    s = a.suggestion
    step = f"rollback {s.change_id} ({s.kind} {s.from_} -> {s.to})" if s.change_id else s.action
    shown = a.evidence if evidence is None else a.evidence[:evidence]
    details: dict[str, Any] = {
        "id": a.id,
        "status": a.status,
        "metric": a.metric,
        "delta_pct": round(a.delta_pct, 2),
        "before": a.before,
        "after": a.after,
        "layers": a.layers,
        "first_failing_stage": a.first_failing_stage,
        "bottleneck": a.bottleneck,
        "scope": {
            "level": a.scope.level,
            "pool": a.scope.pool,
            "model": a.scope.model,
            "device_count": a.scope.device_count,
            **({"hosts": a.scope.hosts, "devices": a.scope.devices} if devices else {}),
        },
        "suggestion": step,
        "guardrail": s.guardrail,
        "confidence": s.confidence,
        "onset": _iso(a.onset_ts),
        "evidence": [
            {
                "stage": e.stage,
                "indicator": e.indicator,
                "layer": e.layer,
                "before": e.before,
                "after": e.after,
                "score": e.score,
            }
            for e in shown
        ],
    }
    if a.not_judged:  # stages its devices could not show failing, for lack of fields
        details["not_judged"] = describe(a.not_judged, a.scope.device_count)
    if len(shown) < len(a.evidence):
        details["evidence_truncated"] = len(a.evidence) - len(shown)
    return details


class PagerDutySink(KeyedHttpSink):
    """Sends each alert record as a PagerDuty Events v2 trigger or resolve."""

    name = "pagerduty"

    def __init__(self, settings: PagerDutySettings, http: Http | None = None) -> None:
        if settings.routing_key is None:
            raise ValueError("the PagerDuty sink needs sinks.pagerduty.routing_key")
        self.settings = settings
        self._routing_key = settings.routing_key.get_secret_value()
        super().__init__(settings, http, f"pagerduty {mask_url(settings.url)}")

    def _links(self, a: Alert) -> list[dict[str, str]]:
        s = self.settings
        runbook = urljoin(s.runbook_base_url, a.runbook) if s.runbook_base_url else a.runbook
        links = [{"href": runbook, "text": "runbook"}]
        if s.external_url:
            links.append({"href": self.incident_url(a.id), "text": "flopwatch incident"})
        return links

    def incident_url(self, aid: str) -> str:
        """The incident page of an alert (`external_url` must be set)."""
        return f"{(self.settings.external_url or '').rstrip('/')}/alerts/{aid}"

    def render(self, alert: Alert) -> bytes:
        """The event for one record, as JSON under the size bound."""
        if alert.status == "resolved":
            return self.ending_from(alert.id, "")
        event: dict[str, Any] = {
            "routing_key": self._routing_key,
            "event_action": "trigger",
            "dedup_key": alert.id[:_DEDUP_MAX],
            "client": "flopwatch",
            "links": self._links(alert),
            "payload": {
                "summary": alert.summary[:_SUMMARY_MAX],
                "severity": SEVERITY[alert.severity],
                "source": alert.scope.pool or alert.scope.model or "fleet",
                "timestamp": _iso(alert.ts),
                "component": ",".join(alert.layers),
                "group": alert.scope.pool or "",
                "class": alert.bottleneck,
                "custom_details": _details(alert, None, devices=True),
            },
        }
        if self.settings.external_url:
            event["client_url"] = self.incident_url(alert.id)
        return self._fit(alert, event)

    def _fit(self, alert: Alert, event: dict[str, Any]) -> bytes:
        """Cut evidence (halving), then the host and device lists, until the event fits."""
        limit = self.settings.max_event_bytes
        body = json.dumps(event).encode()
        keep: int | None = len(alert.evidence)
        devices = True
        while len(body) > limit:
            if keep:
                keep //= 2
            elif devices:
                devices = False
            else:
                raise ValueError(f"event of {len(body)} bytes exceeds {limit} without evidence")
            event["payload"]["custom_details"] = _details(alert, keep, devices)
            body = json.dumps(event).encode()
        return body

    def ending_data(self, item: Item) -> str:
        """Nothing: a resolve needs only the dedup key (the routing key is never stored)."""
        return ""

    def ending_from(self, aid: str, data: str) -> bytes:
        """The resolve event for an alert id."""
        event = {"routing_key": self._routing_key, "event_action": "resolve",
                 "dedup_key": aid[:_DEDUP_MAX]}  # fmt: skip
        return json.dumps(event).encode()

    async def post(self, body: bytes) -> None:
        """POST one event; a refusal's text never carries the routing key into the log."""
        try:
            await self.http.post(self.settings.url, body, {"Content-Type": "application/json"},
                                 self.settings.timeout_s)  # fmt: skip
        except SinkError as exc:
            text = str(exc)
            if self._routing_key and self._routing_key in text:
                raise type(exc)(text.replace(self._routing_key, "***"), exc.retry_after_s) from None
            raise
