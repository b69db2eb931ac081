"""A bounded, coalescing retry queue per receiver, drained by its own task.

`put` returns at once, so a slow or dead receiver never stalls the pipeline or
another receiver. What is queued is keyed (by alert id, or by alert id and label
set): a newer state of a key replaces the queued one, because only the latest state
of an alert needs delivering. Over `queue_max` keys the oldest *firing* states are
dropped and counted; an item that ends something at the receiver (a resolve) is
never dropped by the bound, since nothing would ever end that page otherwise. Ends
are bounded by what is open at the receiver, which the incident caps bound.

Failures back off exponentially from `backoff_s` to `backoff_max_s` with jitter (each
delay drawn from its upper half), or as long as a Retry-After asks, up to the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from monitor.config import DeliverySettings
from monitor.errors import SinkError
from monitor.log import get_logger

_WARN_EVERY_S = 60.0  # one "queue full" line a minute at most, with the count dropped


@dataclass(slots=True)
class Item:
    """One queued delivery: the sink's payload, and whether it ends something."""

    body: Any
    ending: bool = False
    key: Hashable = None  # set by `put`
    seq: int = 0  # order of `put`, for `flush`


Deliver = Callable[[list[Item]], Awaitable[None]]


class DeliveryQueue:
    """Holds a receiver's undelivered items and delivers them in order, `batch_max` at a time."""

    def __init__(
        self, deliver: Deliver, settings: DeliverySettings, name: str, batch_max: int | None = 1
    ) -> None:
        self.deliver = deliver
        self.settings = settings
        self.name = name
        self.batch_max = batch_max  # None: everything queued in one request
        self.items: dict[Hashable, Item] = {}  # insertion-ordered: oldest first
        self.dropped = 0  # firing states dropped by the bound
        self.rejected = 0  # items the receiver refused for good (4xx), dropped
        self.failing_since: float | None = None  # monotonic; first failure since a success
        self.log = get_logger("sink.queue").bind(receiver=name)
        self._seq = 0
        self._failures = 0
        self._backoff = 0.0
        self._retry_at = 0.0
        self._wake = asyncio.Event()  # something was queued
        self._now = asyncio.Event()  # `flush`: try now, whatever the backoff
        self._tried = asyncio.Condition()
        self._dropped_logged = 0
        self._warned_at = -_WARN_EVERY_S
        self._task: asyncio.Task[None] | None = None

    def put(self, key: Hashable, item: Item) -> None:
        """Queue the latest state of `key` (replacing a queued older one) and wake the task."""
        self._seq += 1
        item.key, item.seq = key, self._seq
        self.items.pop(key, None)
        self.items[key] = item
        self._trim()
        self._wake.set()
        self._ensure_task()

    def _trim(self) -> None:
        excess = len(self.items) - self.settings.queue_max
        if excess <= 0:
            return
        drop = [k for k, it in self.items.items() if not it.ending][:excess]
        for key in drop:
            del self.items[key]
        self.dropped += len(drop)
        now = time.monotonic()
        if drop and now - self._warned_at >= _WARN_EVERY_S:
            self.log.warning("delivery queue full: oldest firing states dropped",
                             dropped=self.dropped - self._dropped_logged,
                             queue_max=self.settings.queue_max)  # fmt: skip
            self._warned_at, self._dropped_logged = now, self.dropped

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            try:
                self._task = asyncio.get_running_loop().create_task(self._run())
            except RuntimeError:  # no loop yet: the first put or flush inside one starts it
                self._task = None

    async def flush(self, timeout_s: float) -> bool:
        """Try what is queued now at once (cutting a backoff short) and wait until it is
        delivered, a try fails, or `timeout_s` passes. True: nothing of it is left."""
        target, failures = self._seq, self._failures

        def settled() -> bool:
            left = any(it.seq <= target for it in self.items.values())
            return not left or self._failures > failures

        if settled():
            return True
        self._ensure_task()
        self._now.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s), self._tried:
                await self._tried.wait_for(settled)
        return not any(it.seq <= target for it in self.items.values())

    async def _run(self) -> None:
        while True:
            if not self.items:
                self._wake.clear()
                await self._wake.wait()
            delay = self._retry_at - time.monotonic()
            if delay > 0 and not self._now.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._now.wait(), delay)
            self._now.clear()
            if self.items:
                await self._attempt()
            async with self._tried:
                self._tried.notify_all()

    async def _attempt(self) -> None:
        keys = list(self.items)[: self.batch_max]
        batch = [self.items[k] for k in keys]
        refused: SinkError | None = None
        try:
            await self.deliver(batch)
        except SinkError as exc:
            if exc.retriable:
                self._failed(exc, len(batch), exc.retry_after_s)
                return
            refused = exc
        except Exception as exc:  # a bug in one sink must not end its queue
            self.log.exception("delivery failed", error=repr(exc)[:300])
            self._failed(exc, len(batch), None)
            return
        if refused is not None:
            self.rejected += len(batch)
            self.log.error("receiver rejected a delivery; not retried", items=len(batch),
                           error=str(refused))  # fmt: skip
        self._remove(keys, batch)
        self._backoff = 0.0
        self._retry_at = 0.0
        if self.failing_since is not None:
            self.log.info("receiver recovered", failed_s=round(time.monotonic() -
                          self.failing_since, 1))  # fmt: skip
        self.failing_since = None

    def _remove(self, keys: list[Hashable], batch: list[Item]) -> None:
        """Drop what was delivered, unless a newer state of the key arrived meanwhile."""
        for key, item in zip(keys, batch, strict=True):
            if self.items.get(key) is item:
                del self.items[key]

    def _failed(self, exc: Exception, n: int, retry_after_s: float | None) -> None:
        now = time.monotonic()
        self._failures += 1
        self._now.clear()  # a flush waiting on this try is settled by its failure
        if self.failing_since is None:
            self.failing_since = now
        s = self.settings
        self._backoff = min(2 * self._backoff, s.backoff_max_s) if self._backoff else s.backoff_s
        delay = self._backoff * (0.5 + 0.5 * random.random())  # noqa: S311 - spreading, not secrets
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, s.backoff_max_s))
        self._retry_at = now + delay
        self.log.warning("delivery failed, retrying", items=n, queued=len(self.items),
                         error=str(exc)[:300], retry_in_s=round(delay, 2),
                         failing_s=round(now - self.failing_since, 1))  # fmt: skip

    async def close(self) -> None:
        """Stop the task; what is still queued stays in `items` (and in delivery state)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
