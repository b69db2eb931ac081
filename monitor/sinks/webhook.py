"""Generic webhook sink: each alert record POSTed as JSON, signed with HMAC-SHA256.

The body is the alert record exactly as on the alerts topic (contract §5). Each
request carries

    X-Flopwatch-Timestamp: <unix seconds when this request was signed>
    X-Flopwatch-Signature: v1=<hex HMAC-SHA256(key, timestamp + "." + body)>[, v1=<hex>]

with one `v1=` entry per configured key (`key` first, then `previous_key` during a
rotation), so a receiver holding either key verifies it. A retry is signed afresh,
so a receiver can reject any timestamp outside its replay window (docs/alerts.md).
"""

from __future__ import annotations

import hashlib
import hmac
import time

from monitor.config import WebhookSettings, mask_url
from monitor.sinks.http import Http
from monitor.sinks.jsonl import alert_line
from monitor.sinks.keyed import KeyedHttpSink
from monitor.sinks.queue import Item
from monitor.wire import Alert

TIMESTAMP_HEADER = "X-Flopwatch-Timestamp"
SIGNATURE_HEADER = "X-Flopwatch-Signature"


def sign(keys: list[bytes], timestamp: int, body: bytes) -> str:
    """The signature header's value: `v1=<hex>` per key, comma-separated, in key order."""
    signed = str(timestamp).encode() + b"." + body
    return ", ".join("v1=" + hmac.new(key, signed, hashlib.sha256).hexdigest() for key in keys)


class WebhookSink(KeyedHttpSink):
    """POSTs each alert record to one URL, signed; retried with backoff until answered."""

    name = "webhook"

    def __init__(self, settings: WebhookSettings, http: Http | None = None) -> None:
        if not settings.url or settings.key is None:
            raise ValueError("the webhook sink needs sinks.webhook.url and sinks.webhook.key")
        self.settings = settings
        self.url = settings.url
        self._keys = [
            k.get_secret_value().encode()
            for k in (settings.key, settings.previous_key)
            if k is not None
        ]
        super().__init__(settings, http, f"webhook {mask_url(settings.url)}")

    def render(self, alert: Alert) -> bytes:
        """The alert record as compact JSON (stable key order)."""
        return alert_line(alert).rstrip(b"\n")

    def ending_data(self, item: Item) -> str:
        """The resolved record itself (it holds no secret; signing happens per request)."""
        body: bytes = item.body
        return body.decode()

    def ending_from(self, aid: str, data: str) -> bytes:
        """The resolved record kept in the checkpoint."""
        return data.encode()

    async def post(self, body: bytes) -> None:
        """POST one record, signed now."""
        ts = int(time.time())
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: str(ts),
            SIGNATURE_HEADER: sign(self._keys, ts, body),
        }
        await self.http.post(self.url, body, headers, self.settings.timeout_s)
