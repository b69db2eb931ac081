"""Prometheus Alertmanager sink: POST /api/v2/alerts to every instance, re-send, resolve.

Alertmanager identifies an alert by its label set and auto-resolves it after
`resolve_timeout` unless it is posted again, so firing alerts are re-posted
every `resend_s`; a resolved incident is posted once more with `endsAt`. When
an alert's labels change (severity or scope grew), the old label set is
resolved so on-call never sees two copies of one incident. HA: send to every
instance, never through a load balancer (Alertmanager docs). Each instance has
its own delivery queue (`monitor/sinks/queue.py`), so a slow or dead one delays
neither the pipeline nor the others.

What may be open in Alertmanager (label sets posted firing, ends not yet accepted) is
`delivery_state()`; the runner keeps it in the checkpoint, and a restarted or new
owner `adopt`s it, so it ends exactly the label sets that are open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from monitor.config import AlertmanagerSettings, mask_url
from monitor.core.coverage import describe
from monitor.log import get_logger
from monitor.sinks.http import Http
from monitor.sinks.queue import Deliver, DeliveryQueue, Item
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
    if a.not_judged:
        # Stages its devices could not show failing, for lack of fields (`Alert.not_judged`).
        body["annotations"]["not_judged"] = describe(a.not_judged, a.scope.device_count)[:1024]
    if ends_at is not None:
        body["endsAt"] = _rfc3339(ends_at)
    if external_url:
        body["generatorURL"] = f"{external_url.rstrip('/')}/alerts/{a.id}"
    return body


def _key(labels: dict[str, str]) -> tuple[str, str]:
    """What identifies a queued post: the alert id and its exact label set."""
    return labels.get("flopwatch_id", ""), json.dumps(labels, sort_keys=True)


def _ending(labels: dict[str, str], starts_at: str, now: float) -> dict[str, Any]:
    """The post that ends a label set (Alertmanager wants startsAt before endsAt)."""
    return {"labels": labels, "startsAt": starts_at, "endsAt": _rfc3339(now)}


class AlertmanagerSink:
    """Posts alerts to every configured Alertmanager and keeps firing ones alive.

    Firing alerts are re-posted every `resend_s`, which also repairs a dropped or failed
    post. What ends an alert (a resolve, or the old label set of one whose labels changed)
    is posted once, so it stays queued per instance until that instance accepts it:
    otherwise a page outlives its incident until Alertmanager's `resolve_timeout`, or
    forever while an old label set is re-posted by nobody.
    """

    def __init__(self, settings: AlertmanagerSettings, http: Http | None = None) -> None:
        self.settings = settings
        self.log = get_logger("sink.alertmanager")
        self.http = http or Http()
        self._own_http = http is None
        self.active: dict[str, Alert] = {}
        # By alert id: the label set posted (or queued) firing, and its startsAt.
        self._posted_labels: dict[str, dict[str, str]] = {}
        self._starts: dict[str, str] = {}
        # Per instance: posts not accepted yet, by (alert id, labels), oldest first.
        self.queues = {
            url: DeliveryQueue(
                self._deliverer(url), settings, f"alertmanager {mask_url(url)}", batch_max=None
            )
            for url in settings.urls
        }
        self.failed_alerts = 0  # alerts that could not be rendered (logged, skipped)
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> dict[str, dict[Any, Item]]:
        """Per instance: what it has not accepted yet."""
        return {url: q.items for url, q in self.queues.items()}

    async def start(self) -> None:
        """Start the background re-send loop."""
        self._task = asyncio.create_task(self._resend_loop())

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Queue the new states for every instance; remember firing ones for re-sending."""
        now = datetime.now(tz=UTC).timestamp()
        for a in alerts:
            try:
                new = labels_of(a)
                body = to_postable(
                    a,
                    ends_at=now if a.status == "resolved" else None,
                    external_url=self.settings.external_url,
                )
            except Exception as exc:  # one alert must not stop the others
                self.failed_alerts += 1
                self.log.exception("alert not rendered for alertmanager", id=a.id, error=str(exc))
                continue
            old = self._posted_labels.get(a.id)
            if old is not None and old != new:
                # Labels changed: end the old series so it does not linger as a duplicate.
                self._put(_ending(old, self._starts.get(a.id, body["startsAt"]), now))
            self._put(body)  # a newer state of the same labels replaces a queued one
            if a.status == "resolved":
                self.active.pop(a.id, None)
                self._posted_labels.pop(a.id, None)
                self._starts.pop(a.id, None)
            else:
                self.active[a.id] = a
                self._posted_labels[a.id] = new
                self._starts[a.id] = body["startsAt"]

    def _put(self, body: dict[str, Any]) -> None:
        for queue in self.queues.values():
            queue.put(_key(body["labels"]), Item(body, ending="endsAt" in body))

    async def flush(self, timeout_s: float) -> bool:
        """Try every instance's queue now; True once all are empty (see DeliveryQueue)."""
        done = await asyncio.gather(*(q.flush(timeout_s) for q in self.queues.values()))
        return all(done)

    def delivery_state(self) -> dict[str, dict[str, list[str]]]:
        """By alert id: each label set that may be open in Alertmanager (JSON, sorted keys)
        → [status, startsAt], status "firing" (posted) or "ending" (end not accepted)."""
        out: dict[str, dict[str, list[str]]] = {}
        for aid, labels in self._posted_labels.items():
            out.setdefault(aid, {})[json.dumps(labels, sort_keys=True)] = [
                "firing", self._starts.get(aid, "")
            ]  # fmt: skip
        for queue in self.queues.values():
            for item in queue.items.values():
                if item.ending:
                    aid, key = _key(item.body["labels"])
                    out.setdefault(aid, {})[key] = ["ending", str(item.body.get("startsAt", ""))]
        return out

    def adopt(self, aid: str, entries: dict[str, list[str]]) -> None:
        """Take over what an earlier owner left open for one alert (`delivery_state`).

        A firing label set becomes the alert's posted one, so the next record ends it if
        its labels differ; an unaccepted end is queued again for every instance.
        """
        now = datetime.now(tz=UTC).timestamp()
        for key, (status, starts_at) in entries.items():
            labels = json.loads(key)
            if status == "firing":
                if aid not in self._posted_labels:
                    self._posted_labels[aid] = labels
                    self._starts[aid] = starts_at
                elif self._posted_labels[aid] != labels:  # this process posted another
                    self._put(_ending(labels, starts_at, now))
            else:
                self._put(_ending(labels, starts_at, now))

    def failing_since(self) -> float | None:
        """Monotonic time since which every instance has refused posts (None: one takes them)."""
        since = [q.failing_since for q in self.queues.values()]
        if not since or any(t is None for t in since):
            return None
        return max(t for t in since if t is not None)

    def forget(self, ids: Sequence[str]) -> None:
        """Stop re-posting these alerts (another member owns their incidents now); nothing
        is posted, so Alertmanager sees no gap while the new owner takes over."""
        for aid in ids:
            self.active.pop(aid, None)
            self._posted_labels.pop(aid, None)
            self._starts.pop(aid, None)

    def _deliverer(self, url: str) -> Deliver:
        async def deliver(items: list[Item]) -> None:
            await self._post(url, [i.body for i in items])

        return deliver

    async def _post(self, url: str, batch: list[dict[str, Any]]) -> None:
        await self.http.post(url.rstrip("/") + "/api/v2/alerts", json.dumps(batch).encode(),
                             {"Content-Type": "application/json"},
                             self.settings.timeout_s)  # fmt: skip

    async def _resend_loop(self) -> None:
        ext = self.settings.external_url
        while True:
            await asyncio.sleep(self.settings.resend_s)
            for a in list(self.active.values()):
                self._put(to_postable(a, external_url=ext))

    async def close(self) -> None:
        """Stop re-sending and delivering (firing alerts stay until Alertmanager's
        resolve_timeout); the client is closed only if this sink made it."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for queue in self.queues.values():
            await queue.close()
        if self._own_http:
            await self.http.close()
