"""Prometheus Alertmanager sink: POST /api/v2/alerts to every instance, re-send, resolve.

Alertmanager identifies an alert by its label set and auto-resolves it after
`resolve_timeout` unless it is posted again, so firing alerts are re-posted
every `resend_s`; a resolved incident is posted once more with `endsAt`. When
an alert's labels change (severity or scope grew), the old label set is
resolved so on-call never sees two copies of one incident. HA: send to every
instance, never through a load balancer (Alertmanager docs).

What may be open in Alertmanager (label sets posted firing, ends not yet accepted) is
`delivery_state()`; the runner keeps it in the checkpoint, and a restarted or new
owner `adopt`s it, so it ends exactly the label sets that are open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from monitor.config import AlertmanagerSettings, mask_url
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


def _key(labels: dict[str, str]) -> tuple[str, str]:
    """What identifies a queued post: the alert id and its exact label set."""
    return labels.get("flopwatch_id", ""), json.dumps(labels, sort_keys=True)


def _ending(labels: dict[str, str], starts_at: str, now: float) -> dict[str, Any]:
    """The post that ends a label set (Alertmanager wants startsAt before endsAt)."""
    return {"labels": labels, "startsAt": starts_at, "endsAt": _rfc3339(now)}


class AlertmanagerSink:
    """Posts alerts to every configured Alertmanager and keeps firing ones alive.

    Firing alerts are re-posted every `resend_s`, which also repairs a failed post. What
    ends an alert (a resolve, or the old label set of one whose labels changed) is posted
    once, so a failed one is kept per instance and retried with backoff until that
    instance accepts it: otherwise a page outlives its incident until Alertmanager's
    `resolve_timeout`, or forever while an old label set is re-posted by nobody.
    """

    def __init__(self, settings: AlertmanagerSettings) -> None:
        self.settings = settings
        self.log = get_logger("sink.alertmanager")
        self.active: dict[str, Alert] = {}
        # By alert id: the label set posted firing, and its startsAt.
        self._posted_labels: dict[str, dict[str, str]] = {}
        self._starts: dict[str, str] = {}
        # Per instance: ending posts not accepted yet, by (alert id, labels); retry timing.
        self.pending: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            url: {} for url in settings.urls
        }
        # Per instance: monotonic time of the first failed post since the last accepted one.
        self._down: dict[str, float] = {}
        self.failed_alerts = 0  # alerts that could not be rendered (logged, skipped)
        self._retry_at: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the background re-send loop."""
        self._task = asyncio.create_task(self._resend_loop())

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Post new states now; remember firing ones for re-sending."""
        now = datetime.now(tz=UTC).timestamp()
        batch: list[dict[str, Any]] = []
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
                batch.append(_ending(old, self._starts.get(a.id, body["startsAt"]), now))
            for queue in self.pending.values():  # a newer state of the same labels wins
                queue.pop(_key(new), None)
            batch.append(body)
            if a.status == "resolved":
                self.active.pop(a.id, None)
                self._posted_labels.pop(a.id, None)
                self._starts.pop(a.id, None)
            else:
                self.active[a.id] = a
                self._posted_labels[a.id] = new
                self._starts[a.id] = body["startsAt"]
        if batch:
            failed = await self._post_all(batch) or []
            for url in failed:
                self._keep(url, [b for b in batch if "endsAt" in b])

    def delivery_state(self) -> dict[str, dict[str, list[str]]]:
        """By alert id: each label set that may be open in Alertmanager (JSON, sorted keys)
        → [status, startsAt], status "firing" (posted) or "ending" (end not accepted)."""
        out: dict[str, dict[str, list[str]]] = {}
        for aid, labels in self._posted_labels.items():
            out.setdefault(aid, {})[json.dumps(labels, sort_keys=True)] = [
                "firing", self._starts.get(aid, "")
            ]  # fmt: skip
        for queue in self.pending.values():
            for (aid, key), item in queue.items():
                out.setdefault(aid, {})[key] = ["ending", str(item.get("startsAt", ""))]
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
                    for url in self.settings.urls:
                        self._keep(url, [_ending(labels, starts_at, now)])
            else:
                for url in self.settings.urls:
                    self._keep(url, [_ending(labels, starts_at, now)])

    def failing_since(self) -> float | None:
        """Monotonic time since which every instance has refused posts (None: one takes them)."""
        urls = self.settings.urls
        if not urls or any(u not in self._down for u in urls):
            return None
        return max(self._down[u] for u in urls)

    def _keep(self, url: str, ending: list[dict[str, Any]]) -> None:
        """Queue ending posts an instance did not accept, and schedule its retry."""
        if not ending:
            return
        queue = self.pending.setdefault(url, {})
        for item in ending:
            key = (
                item["labels"].get("flopwatch_id", ""),
                json.dumps(item["labels"], sort_keys=True),
            )
            queue[key] = item
        if url not in self._retry_at:
            self._backoff[url] = min(1.0, self.settings.resend_s)
            self._retry_at[url] = time.monotonic() + self._backoff[url]

    def forget(self, ids: Sequence[str]) -> None:
        """Stop re-posting these alerts (another member owns their incidents now); nothing
        is posted, so Alertmanager sees no gap while the new owner takes over."""
        for aid in ids:
            self.active.pop(aid, None)
            self._posted_labels.pop(aid, None)
            self._starts.pop(aid, None)

    async def _post_all(self, batch: list[dict[str, Any]]) -> list[str]:
        """Post to every instance at once; the URLs that failed."""
        urls = self.settings.urls
        results = await asyncio.gather(
            *(asyncio.to_thread(self._post, url, batch) for url in urls), return_exceptions=True
        )
        failed = []
        for url, res in zip(urls, results, strict=True):
            if isinstance(res, Exception):
                failed.append(url)
                self._down.setdefault(url, time.monotonic())
                self.log.warning("alertmanager post failed", url=mask_url(url), error=str(res))
            else:
                self._down.pop(url, None)
        return failed

    async def _retry(self, url: str) -> None:
        """Post an instance's queued ending posts again; back off while it refuses them."""
        queue = self.pending.get(url, {})
        items = list(queue.values())
        try:
            await asyncio.to_thread(self._post, url, items)
        except AlertmanagerError as exc:
            self._down.setdefault(url, time.monotonic())
            self._backoff[url] = min(2 * self._backoff[url], max(self.settings.resend_s, 1.0))
            jitter = 1.0 + 0.1 * random.random()  # noqa: S311 - spreading retries, not secrets
            self._retry_at[url] = time.monotonic() + self._backoff[url] * jitter
            self.log.warning("alertmanager retry failed", url=mask_url(url), pending=len(items),
                             error=str(exc))  # fmt: skip
            return
        self._down.pop(url, None)
        for item in items:
            key = (
                item["labels"].get("flopwatch_id", ""),
                json.dumps(item["labels"], sort_keys=True),
            )
            if queue.get(key) is item:
                del queue[key]
        if not queue:
            self._retry_at.pop(url, None)

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
        next_resend = time.monotonic() + self.settings.resend_s
        while True:
            wake = min([next_resend, *self._retry_at.values()])
            await asyncio.sleep(max(0.0, wake - time.monotonic()))
            now = time.monotonic()
            for url in [u for u, at in self._retry_at.items() if at <= now]:
                await self._retry(url)
            if now >= next_resend:
                next_resend = now + self.settings.resend_s
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
