"""A real local HTTP receiver for the HTTP sinks' tests (aiohttp.web on 127.0.0.1).

A test scripts what it answers: a list of statuses to answer before accepting
(`refuse`), a `check` that refuses bad payloads (400/401), `hold` to keep requests
waiting until an event is set (a slow receiver), and `stop` / `start` to make it go
away and come back on the same port. Waiting is on conditions with timeouts, never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Request:
    """One request the receiver took (accepted or refused)."""

    headers: dict[str, str]
    body: bytes
    status: int
    path: str = "/hook"

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """An HTTP receiver on a fixed loopback port; answers 202 unless told otherwise."""

    ok_status: int = 202
    ok_body: str = '{"status":"success","message":"Event processed"}'
    # Called per request before accepting: a status to refuse with, or None.
    check: Callable[[dict[str, str], bytes], int | None] | None = None
    refuse: list[int] = field(default_factory=list)  # statuses to answer first, in order
    hold: asyncio.Event | None = None  # requests wait until it is set (a slow receiver)
    requests: list[Request] = field(default_factory=list)
    held: int = 0  # requests waiting on `hold` now
    port: int = 0

    def __post_init__(self) -> None:
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/hook"

    @property
    def accepted(self) -> list[Request]:
        return [r for r in self.requests if r.status < 300]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if not self.port:
            server = site._server  # the port an ephemeral listen got
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        """Go away: the port refuses connections until `start`."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        if self.hold is not None:
            self.held += 1
            await self._notify()
            await self.hold.wait()
            self.held -= 1
        status = self.refuse.pop(0) if self.refuse else None
        if status is None and self.check is not None:
            status = self.check(headers, body)
        status = status or self.ok_status
        self.requests.append(Request(headers, body, status, request.path))
        await self._notify()
        text = self.ok_body if status < 300 else json.dumps({"status": "refused"})
        return web.Response(status=status, text=text, content_type="application/json")

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, pred: Callable[[Receiver], bool], wait_s: float = 20.0) -> None:
        """Wait until `pred(self)` holds (checked after every request)."""
        async with asyncio.timeout(wait_s), self._changed:
            await self._changed.wait_for(lambda: pred(self))


async def until(pred: Callable[[], bool], wait_s: float = 20.0) -> None:
    """Wait until `pred()` holds, checking every 20 ms (for state the sinks keep)."""
    async with asyncio.timeout(wait_s):
        while not pred():  # noqa: ASYNC110 - the sinks' own tasks change it
            await asyncio.sleep(0.02)
