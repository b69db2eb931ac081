"""Prometheus Alertmanager sink: POST /api/v2/alerts to every instance, re-send, resolve.

Alertmanager identifies an alert by its label set and auto-resolves it after
`resolve_timeout` unless it is posted again, so firing alerts are re-posted
every `resend_s`; a resolved incident is posted once more with `endsAt`. When
an alert's labels change (severity or scope grew), the old label set is
resolved so on-call never sees two copies of one incident. HA: send to every
instance, never through a load balancer (Alertmanager docs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from monitor.config import AlertmanagerSettings
from monitor.errors import AlertmanagerError
from monitor.log import get_logger
from monitor.wire import Alert

ALERTNAME = "FlopwatchRegression"
_SEVERITY = {"page": "critical", "ticket": "warning", "info": "info"}


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def labels_of(a: Alert) -> dict[str, str]:
    """The identifying labels: what routing and inhibition match on (no empty values)."""
    labels = {
        "alertname": ALERTNAME,
        "flopwatch_id": a.id,
        "severity": _SEVERITY[a.severity],
        "pool": a.scope.pool or "",
        "model": a.scope.model or "",
        "scope": a.scope.level,
        "metric": a.metric,
        "layer": ",".join(a.layers),
        "stage": a.first_failing_stage,
        "bottleneck": a.bottleneck,
    }
    return {k: v for k, v in labels.items() if v}


def to_postable(
    a: Alert, ends_at: float | None = None, external_url: str | None = None
) -> dict[str, Any]:
    """One Alertmanager v2 postable alert for a flopwatch alert record."""
    s = a.suggestion
    step = f"rollback {s.change_id} ({s.kind} {s.from_} -> {s.to})" if s.change_id else s.action
    evidence = "; ".join(
        f"{e.stage}/{e.indicator}{'@' + e.layer if e.layer else ''}: {e.before:g} -> {e.after:g}"
        for e in a.evidence[:8]
    )
    body: dict[str, Any] = {
        "labels": labels_of(a),
        "annotations": {
            "summary": a.summary[:1024],
            "description": (
                f"{a.delta_pct:+.1f}% {a.metric} on {a.scope.device_count} device(s); "
                f"first failing stage {a.first_failing_stage} ({a.bottleneck}); evidence: "
                f"{evidence}"
            ),
            "suggestion": step,
            "guardrail": s.guardrail,
            "runbook_url": a.runbook,
            "device_count": str(a.scope.device_count),
            "onset": _rfc3339(a.onset_ts),
        },
        "startsAt": _rfc3339(a.onset_ts),
    }
    if ends_at is not None:
        body["endsAt"] = _rfc3339(ends_at)
    if external_url:
        body["generatorURL"] = f"{external_url.rstrip('/')}/alerts/{a.id}"
    return body


class AlertmanagerSink:
    """Posts alerts to every configured Alertmanager and keeps firing ones alive."""

    def __init__(self, settings: AlertmanagerSettings) -> None:
        self.settings = settings
        self.log = get_logger("sink.alertmanager")
        self.active: dict[str, Alert] = {}
        self._posted_labels: dict[str, dict[str, str]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the background re-send loop."""
        self._task = asyncio.create_task(self._resend_loop())

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Post new states now; remember firing ones for re-sending."""
        now = datetime.now(tz=UTC).timestamp()
        batch: list[dict[str, Any]] = []
        for a in alerts:
            old = self._posted_labels.get(a.id)
            new = labels_of(a)
            if old is not None and old != new:
                # Labels changed: end the old series so it does not linger as a duplicate.
                batch.append({"labels": old, "endsAt": _rfc3339(now),
                              "startsAt": _rfc3339(a.onset_ts)})  # fmt: skip
            if a.status == "resolved":
                batch.append(to_postable(a, ends_at=now, external_url=self.settings.external_url))
                self.active.pop(a.id, None)
                self._posted_labels.pop(a.id, None)
            else:
                batch.append(to_postable(a, external_url=self.settings.external_url))
                self.active[a.id] = a
                self._posted_labels[a.id] = new
        if batch:
            await self._post_all(batch)

    def forget(self, ids: Sequence[str]) -> None:
        """Stop re-posting these alerts (another member owns their incidents now); nothing
        is posted, so Alertmanager sees no gap while the new owner takes over."""
        for aid in ids:
            self.active.pop(aid, None)
            self._posted_labels.pop(aid, None)

    async def _post_all(self, batch: list[dict[str, Any]]) -> None:
        results = await asyncio.gather(
            *(asyncio.to_thread(self._post, url, batch) for url in self.settings.urls),
            return_exceptions=True,
        )
        for url, res in zip(self.settings.urls, results, strict=True):
            if isinstance(res, Exception):
                # Best effort per instance; the next re-send retries it.
                self.log.warning("alertmanager post failed", url=url, error=str(res))

    def _post(self, url: str, batch: list[dict[str, Any]]) -> None:
        data = json.dumps(batch).encode()
        req = urllib.request.Request(  # noqa: S310 - URL comes from operator config
            url.rstrip("/") + "/api/v2/alerts",
            data=data,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.settings.timeout_s) as resp:  # noqa: S310
                resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise AlertmanagerError(f"HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise AlertmanagerError(str(exc)) from None

    async def _resend_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resend_s)
            if self.active:
                ext = self.settings.external_url
                await self._post_all(
                    [to_postable(a, external_url=ext) for a in self.active.values()]
                )

    async def close(self) -> None:
        """Stop re-sending (firing alerts stay until Alertmanager's resolve_timeout)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
