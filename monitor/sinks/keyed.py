"""What the PagerDuty and webhook sinks share: one request per alert, queued by alert id.

Only the latest state of an alert needs delivering, so the queue keeps one item per
alert id (`monitor/sinks/queue.py`). What may be open at the receiver is
`delivery_state()`: by alert id, `["firing"]` from the first queued firing state until
a resolve is accepted, and `["ending", data]` while a resolve is queued (`data`: what
the subclass needs to send it again, never a secret). The runner keeps it in the
checkpoint; a restarted or new owner `adopt`s it and sends those resolves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitor.config import DeliverySettings
from monitor.errors import SinkRejected
from monitor.log import get_logger
from monitor.sinks.http import Http
from monitor.sinks.queue import DeliveryQueue, Item
from monitor.wire import Alert


class KeyedHttpSink:
    """Base of the per-alert HTTP sinks; subclasses render, post and persist ends."""

    name = "keyed"

    def __init__(self, settings: DeliverySettings, http: Http | None, receiver: str) -> None:
        self.http = http or Http()
        self._own_http = http is None
        self.log = get_logger(f"sink.{self.name}")
        self.queue = DeliveryQueue(self._deliver, settings, receiver)
        self.open: set[str] = set()  # alert ids that may be firing at the receiver
        self.failed_alerts = 0  # alerts that could not be rendered (logged, skipped)

    def render(self, alert: Alert) -> Any:
        """The payload for one alert record (raises if it cannot be built)."""
        raise NotImplementedError

    def ending_data(self, item: Item) -> str:
        """What `ending_from` needs to send a queued resolve again after a restart."""
        raise NotImplementedError

    def ending_from(self, aid: str, data: str) -> Any:
        """The resolve payload for an alert id from `ending_data`."""
        raise NotImplementedError

    async def post(self, body: Any) -> None:
        """Deliver one payload (SinkError: retry later; SinkRejected: never)."""
        raise NotImplementedError

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Queue each alert's new state; returns at once (delivery is the queue's task)."""
        for a in alerts:
            try:
                body = self.render(a)
            except Exception as exc:  # one alert must not stop the others
                self.failed_alerts += 1
                self.log.exception("alert not rendered", id=a.id, error=str(exc)[:300])
                continue
            resolved = a.status == "resolved"
            if not resolved:
                self.open.add(a.id)
            self.queue.put(a.id, Item(body, ending=resolved))

    async def _deliver(self, items: list[Item]) -> None:
        (item,) = items
        try:
            await self.post(item.body)
        except SinkRejected:
            self._settled(item)
            raise
        self._settled(item)

    def _settled(self, item: Item) -> None:
        """A resolve the receiver answered for good closes the alert there (unless a newer
        state of it was queued meanwhile)."""
        if item.ending and self.queue.items.get(item.key) is item:
            self.open.discard(str(item.key))

    async def flush(self, timeout_s: float) -> bool:
        """Try the queue now; True once it is empty (see DeliveryQueue.flush)."""
        return await self.queue.flush(timeout_s)

    def delivery_state(self) -> dict[str, dict[str, list[str]]]:
        """By alert id: {alert id: ["firing"] or ["ending", data]} (see the module doc)."""
        out = {aid: {aid: ["firing"]} for aid in self.open}
        for key, item in self.queue.items.items():
            if item.ending:
                out[str(key)] = {str(key): ["ending", self.ending_data(item)]}
        return out

    def adopt(self, aid: str, entries: dict[str, list[str]]) -> None:
        """Take over what an earlier owner left open for one alert (`delivery_state`)."""
        for key, (status, *rest) in entries.items():
            if status == "firing":
                self.open.add(key)
            elif key not in self.queue.items:  # a state this process queued is newer
                body = self.ending_from(key, rest[0] if rest else "")
                if body:
                    self.open.add(key)
                    self.queue.put(key, Item(body, ending=True))

    def forget(self, ids: Sequence[str]) -> None:
        """Another member owns these alerts now: it carries what is open."""
        self.open.difference_update(ids)

    def failing_since(self) -> float | None:
        """Monotonic time of the first failed try since the receiver last answered."""
        return self.queue.failing_since

    async def close(self) -> None:
        """Stop delivering; the client is closed only if this sink made it."""
        await self.queue.close()
        if self._own_http:
            await self.http.close()
