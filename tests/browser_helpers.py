"""Headless Chromium driven over the DevTools protocol (aiohttp's websocket client).

Debian's `chromium` (installed by .ci/run); flags as this machine needs them: no sandbox
as root, and no background networking, which a closed network would refuse anyway.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--remote-debugging-port=0"]  # fmt: skip


def chromium_or_skip() -> str:
    """The browser binary; skip without one here, fail in CI (where .ci/run installs it)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it")
        pytest.skip("no headless browser here (apt-get install chromium)")
    return binary


@dataclass
class Loaded:
    """What one page load did: requests made, errors logged, and a way to look at it."""

    url: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Browser:
    """One Chromium and one tab; `load` navigates and records requests and errors."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())
        self.session = ""

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            fut = self._pending.pop(data.get("id", -1), None)
            if fut is None:
                self._events.put_nowait(data)
            elif "error" in data:
                fut.set_exception(RuntimeError(str(data["error"])))
            else:
                fut.set_result(data.get("result", {}))

    async def send(self, method: str, session: bool = True, **params: Any) -> dict[str, Any]:
        """One protocol command (to the tab unless `session` is False), its result."""
        self._id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._id] = fut
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        await self.ws.send_str(json.dumps(msg))
        return await asyncio.wait_for(fut, 30)

    async def open_tab(self, width: int) -> None:
        target = await self.send("Target.createTarget", session=False, url="about:blank")
        att = await self.send("Target.attachToTarget", session=False,
                              targetId=target["targetId"], flatten=True)  # fmt: skip
        self.session = att["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            await self.send(f"{domain}.enable")
        await self.send("Emulation.setDeviceMetricsOverride", width=width, height=900,
                        deviceScaleFactor=1, mobile=False)  # fmt: skip

    async def load(self, url: str) -> Loaded:
        """Navigate and wait for the load event (and a moment for late requests)."""
        while not self._events.empty():
            self._events.get_nowait()
        out = Loaded(url)
        await self.send("Page.navigate", url=url)
        loaded = False
        while True:
            try:
                ev = await asyncio.wait_for(self._events.get(), 0.5 if loaded else 30)
            except TimeoutError:
                if loaded:
                    return out
                raise
            loaded = loaded or ev["method"] == "Page.loadEventFired"
            _note(ev, out)

    async def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value in the page."""
        res = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return res["result"].get("value")

    async def screenshot(self, path: Path) -> Path:
        """The whole page as a PNG."""
        res = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(res["data"]))
        return path

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def _note(ev: dict[str, Any], out: Loaded) -> None:
    method, p = ev["method"], ev.get("params", {})
    if method == "Network.requestWillBeSent" and not p["request"]["url"].startswith("data:"):
        out.requests.append(p["request"]["url"])
    elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
        out.errors.append(f"console.{p['type']}: {p.get('args')}")
    elif method == "Runtime.exceptionThrown":
        out.errors.append(f"exception: {p['exceptionDetails'].get('text')}")
    elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
        out.errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")


@contextlib.asynccontextmanager
async def browser(binary: str, profile: Path, width: int = 1000) -> AsyncIterator[Browser]:
    """A started headless Chromium with one tab open, closed on exit."""
    proc = await asyncio.create_subprocess_exec(
        binary, *FLAGS, f"--user-data-dir={profile}", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        ws_url = await asyncio.wait_for(_devtools_url(proc.stderr), 60)
        drain = asyncio.create_task(proc.stderr.read())  # a full pipe would stall it
        async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
            b = Browser(ws)
            try:
                await b.open_tab(width)
                yield b
            finally:
                await b.close()
        drain.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _devtools_url(stderr: asyncio.StreamReader) -> str:
    while True:
        line = await stderr.readline()
        if not line:
            raise RuntimeError("chromium exited before its DevTools endpoint was up")
        m = re.search(rb"DevTools listening on (ws://\S+)", line)
        if m:
            return m.group(1).decode()
