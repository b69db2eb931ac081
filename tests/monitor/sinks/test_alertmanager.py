"""The Alertmanager sink's keep-alive: what it re-posts, and what it stops re-posting."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from factories import ListSource, fleet

from monitor.config import AlertmanagerSettings, Settings
from monitor.core.pipeline import Pipeline
from monitor.daemon.runner import Runner
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

    async def record(url: str, batch: list[dict[str, Any]]) -> None:
        posted.append(batch)
        if len(posted) >= 3:  # the first post and two re-posts
            reposted.set()

    sink._post = record  # type: ignore[method-assign]
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


class _Receiver:
    """A real HTTP server standing in for Alertmanager: answers 503 while `down`, and keeps
    every batch it accepted."""

    def __init__(self) -> None:
        import http.server  # noqa: PLC0415
        import threading  # noqa: PLC0415

        self.down = True
        self.accepted: list[list[dict[str, Any]]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.down:
                    self.send_response(503)
                else:
                    receiver.accepted.append(json.loads(body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_a_resolve_refused_while_alertmanager_is_down_arrives_when_it_is_back() -> None:
    """With Alertmanager answering 503, the resolve is kept and retried with backoff until
    accepted (it used to be posted once and lost, so the page outlived its incident)."""
    p = Pipeline(Settings())
    alerts = [a for b in fleet(70, regress_at=45, change_at=44) for a in p.process(b).alerts]
    firing = alerts[-1]
    resolved = msgspec.structs.replace(firing, status="resolved")
    am = _Receiver()
    sink = AlertmanagerSink(AlertmanagerSettings(urls=[am.url], resend_s=0.2, timeout_s=2))
    await sink.start()
    try:
        await sink.send([firing])
        await sink.send([resolved])
        assert len(sink.pending[am.url]) == 1
        await asyncio.sleep(0.5)  # still down: retried, kept
        assert am.accepted == []
        assert len(sink.pending[am.url]) == 1
        am.down = False
        for _ in range(100):
            if not sink.pending[am.url]:
                break
            await asyncio.sleep(0.05)
        ends = [a for batch in am.accepted for a in batch if "endsAt" in a]
        assert [a["labels"]["flopwatch_id"] for a in ends] == [firing.id]
        assert sink.active == {}
    finally:
        await sink.close()
        am.close()


async def test_failing_since_only_while_every_instance_refuses() -> None:
    """The sink reports failing (what /readyz and flopwatch_sink_failing_seconds read) from
    the first refused post while no instance takes posts, and not once one does."""
    p = Pipeline(Settings())
    alerts = [a for b in fleet(70, regress_at=45, change_at=44) for a in p.process(b).alerts]
    am = _Receiver()
    sink = AlertmanagerSink(AlertmanagerSettings(urls=[am.url], resend_s=3600, timeout_s=2))
    try:
        assert sink.failing_since() is None
        await sink.send(alerts[-1:])
        assert not await sink.flush(5)  # tried once, refused
        since = sink.failing_since()
        assert since is not None
        runner = Runner(ListSource([]), p, [sink])
        assert runner.sink_failing()["alertmanager"] >= 0
        await sink.send(alerts[-1:])
        await sink.flush(5)
        assert sink.failing_since() == since  # still down: failing since the first refusal
        am.down = False
        await sink.send(alerts[-1:])
        assert await sink.flush(5)
        assert sink.failing_since() is None
        assert runner.sink_failing() == {}
    finally:
        await sink.close()
        am.close()
