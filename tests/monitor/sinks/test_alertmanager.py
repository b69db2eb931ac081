"""The Alertmanager sink's keep-alive: what it re-posts, and what it stops re-posting."""

from __future__ import annotations

import asyncio
from typing import Any

from factories import fleet

from monitor.config import AlertmanagerSettings, Settings
from monitor.core.pipeline import Pipeline
from monitor.sinks.alertmanager import AlertmanagerSink


async def test_forgotten_alerts_are_no_longer_re_posted() -> None:
    """A page handed over to another replica leaves this sink's keep-alive at once, with
    nothing posted for it (no resolve: the alert goes on under its new owner)."""
    p = Pipeline(Settings())
    firing = [a for b in fleet(70, regress_at=45, change_at=44) for a in p.process(b).alerts]
    assert firing
    sink = AlertmanagerSink(AlertmanagerSettings(urls=["http://127.0.0.1:9"], resend_s=0.05))
    posted: list[list[dict[str, Any]]] = []
    reposted = asyncio.Event()

    async def record(batch: list[dict[str, Any]]) -> None:
        posted.append(batch)
        if len(posted) >= 3:  # the first post and two re-posts
            reposted.set()

    sink._post_all = record  # type: ignore[method-assign]
    await sink.start()
    try:
        await sink.send(firing)
        await asyncio.wait_for(reposted.wait(), 10)
        sink.forget([firing[0].id])
        assert sink.active == {}
        n = len(posted)
        await asyncio.sleep(0.3)  # six re-post periods: the loop finds nothing to keep alive
        assert len(posted) <= n + 1  # at most a re-post already under way
        assert all("endsAt" not in a for batch in posted for a in batch)
    finally:
        await sink.close()
