"""Delivery queues: latest state per alert, a bound that never drops an end, and a
receiver that hangs stalling neither the pipeline nor the other sinks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from alert_records import firing
from factories import fleet
from receivers import Receiver, until

from monitor.config import DeliverySettings, PagerDutySettings, Settings, WebhookSettings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.daemon.runner import Runner
from monitor.errors import SinkError
from monitor.sinks.memory import ListSink
from monitor.sinks.pagerduty import PagerDutySink
from monitor.sinks.queue import DeliveryQueue, Item
from monitor.sinks.webhook import WebhookSink


async def _refuse(items: list[Item]) -> None:
    raise SinkError("down")


async def test_latest_state_per_key_and_the_bound_drops_oldest_firing_only() -> None:
    """A newer state replaces the queued one; past queue_max the oldest firing states go
    (counted), while ends stay even beyond the bound."""
    q = DeliveryQueue(_refuse, DeliverySettings(queue_max=3, backoff_s=60, backoff_max_s=60),
                      "test")  # fmt: skip
    try:
        q.put("end-1", Item("resolve 1", ending=True))
        for k in "abcde":
            q.put(k, Item(f"fire {k}"))
        assert list(q.items) == ["end-1", "d", "e"]
        assert q.dropped == 3
        q.put("e", Item("fire e, newer"))
        assert list(q.items) == ["end-1", "d", "e"]
        assert q.items["e"].body == "fire e, newer"
        q.put("end-2", Item("resolve 2", ending=True))
        q.put("end-3", Item("resolve 3", ending=True))
        q.put("end-4", Item("resolve 4", ending=True))
        assert list(q.items) == ["end-1", "end-2", "end-3", "end-4"]
        assert q.dropped == 5
        q.put("f", Item("fire f"))  # no firing state fits while ends fill the bound
        assert "f" not in q.items
        assert q.dropped == 6
    finally:
        await q.close()


async def test_a_state_replaced_in_flight_is_delivered_after_the_old_one() -> None:
    """An item delivered while a newer state of its key was queued is not taken for the
    newer one: both go out, in order."""
    seen: list[Any] = []
    gate = asyncio.Event()

    async def slow(items: list[Item]) -> None:
        seen.extend(i.body for i in items)
        await gate.wait()

    q = DeliveryQueue(slow, DeliverySettings(), "test")
    try:
        q.put("a", Item("v1"))
        await until(lambda: seen == ["v1"])
        q.put("a", Item("v2"))
        gate.set()
        assert await q.flush(5)
    finally:
        await q.close()
    assert seen == ["v1", "v2"]


class _Source:
    """Fixed batches; counts commits."""

    def __init__(self, batches: list[list[RawMessage]]) -> None:
        self._batches = batches
        self.commits = 0

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        for b in self._batches:
            yield b

    async def commit(self) -> None:
        self.commits += 1

    async def close(self) -> None:
        return None


@pytest.fixture
async def receivers():
    hung = Receiver(ok_status=200, hold=asyncio.Event())
    pd = Receiver()
    await hung.start()
    await pd.start()
    yield hung, pd
    hung.hold.set()  # type: ignore[union-attr]
    await hung.stop()
    await pd.stop()


async def test_a_hung_receiver_stalls_neither_the_pipeline_nor_the_other_sinks(
    receivers: tuple[Receiver, Receiver],
) -> None:
    """The webhook receiver takes requests and never answers: the runner still processes
    and commits every batch, PagerDuty gets trigger and resolve, the in-memory sink every
    record; the webhook then fails its timeout (what /readyz reads) and, once the receiver
    answers again, gets the incident's latest state."""
    hung, pd = receivers
    fast = {"timeout_s": 0.5, "backoff_s": 0.05, "backoff_max_s": 0.2}
    webhook = WebhookSink(WebhookSettings(url=hung.url, key="k", **fast))
    pager = PagerDutySink(PagerDutySettings(routing_key="r" * 32, url=pd.url, **fast))
    memory = ListSink()
    batches = fleet(80, regress_at=40, change_at=39) + fleet(130, seed=9)[80:]
    source = _Source(batches)
    runner = Runner(source, Pipeline(Settings()), [webhook, pager, memory], drain_s=0.3)
    try:
        await webhook.send([firing()])  # hangs from before the run on
        await hung.wait_for(lambda r: r.held == 1)
        await runner.run()
        assert source.commits == len(batches)
        assert [a.status for a in memory.alerts] == ["firing", "resolved"]
        assert hung.requests == []  # not one answered while the pipeline ran through
        # Latest state per alert: the trigger may have been replaced by the resolve while
        # still queued (the run yields rarely); the resolve always goes out, last.
        await pd.wait_for(lambda r: bool(r.accepted) and r.accepted[-1].json()[
            "event_action"] == "resolve")  # fmt: skip
        assert [r.json()["event_action"] for r in pd.accepted] in (
            ["trigger", "resolve"], ["resolve"])  # fmt: skip
        await until(lambda: "webhook" in runner.sink_failing())
        assert "pagerduty" not in runner.sink_failing()
        assert runner.sink_failing_s() > 0
        hung.hold.set()  # type: ignore[union-attr]
        await until(lambda: not webhook.queue.items and webhook.failing_since() is None)
        assert runner.sink_failing() == {}
    finally:
        await webhook.close()
        await pager.close()
    # At least once: the held first request may be answered late as well, but the last
    # record the receiver took is the resolve.
    assert hung.accepted[-1].json()["status"] == "resolved"
