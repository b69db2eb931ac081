"""The health and metrics server: routes, status codes, readiness, and port 0 = off."""

from __future__ import annotations

import asyncio
import re
import socket
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter
from structlog.testing import capture_logs

from monitor.daemon.http import HttpServer, serve_http


def _get(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, method=method)  # noqa: S310 - loopback test URL
    try:
        with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


async def fetch(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    """An HTTP request from a thread, as a real client (urllib) makes it."""
    return await asyncio.to_thread(_get, url, method)


async def test_routes_readiness_and_metrics() -> None:
    """healthz always 200; readyz follows the callback; metrics renders the given registry."""
    registry = CollectorRegistry()
    hits = Counter("flopwatch_test_hits", "test counter", registry=registry)
    hits.inc(3)
    ready = [False]
    server = HttpServer(registry, lambda: ready[0])
    try:
        with capture_logs() as logs:
            await server.start()
        assert [e["port"] for e in logs if e["event"] == "serving"] == [server.port]
        base = f"http://127.0.0.1:{server.port}"
        assert await fetch(f"{base}/healthz") == (200, "text/plain; charset=utf-8", b"ok\n")
        assert (await fetch(f"{base}/readyz"))[0] == 503
        ready[0] = True
        assert (await fetch(f"{base}/readyz?verbose=1"))[0] == 200
        status, ctype, body = await fetch(f"{base}/metrics")
        assert status == 200
        assert ctype.startswith("text/plain; version=")
        assert b"flopwatch_test_hits_total 3.0" in body
        head = await fetch(f"{base}/metrics", "HEAD")
        assert head[0] == 200
        assert head[2] == b""
        assert (await fetch(f"{base}/nope"))[0] == 404
        assert (await fetch(f"{base}/metrics", "POST"))[0] == 405
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"garbage\r\n\r\n")
        # No version could be parsed from the request: aiohttp answers as HTTP/1.0.
        assert re.match(rb"HTTP/1\.[01] 400 ", await reader.read())
        writer.close()
    finally:
        await server.close()


async def test_port_zero_serves_nothing() -> None:
    """http_port 0 disables the server."""
    assert await serve_http(0, CollectorRegistry(), lambda: True, "127.0.0.1") is None


async def test_taken_port_is_logged_not_fatal() -> None:
    """A port in use is an error in the log; the daemon keeps alerting without /metrics."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with capture_logs() as logs:
            assert await serve_http(port, CollectorRegistry(), lambda: True, "127.0.0.1") is None
    assert [e["port"] for e in logs if e["event"] == "cannot serve /metrics"] == [port]


class _Pages:
    def index(self) -> str:
        return "<!DOCTYPE html><p>list</p>"

    def page(self, alert_id: str) -> str | None:
        return f"<!DOCTYPE html><p>{alert_id}</p>" if alert_id == "fw-1" else None


async def test_alert_pages_when_given_and_404_otherwise() -> None:
    """/alerts and /alerts/<id> serve the pages' HTML; an unknown id, or no pages, is 404."""
    with_pages = HttpServer(CollectorRegistry(), lambda: True, pages=_Pages())
    without = HttpServer(CollectorRegistry(), lambda: True)
    await with_pages.start()
    await without.start()
    try:
        base = f"http://127.0.0.1:{with_pages.port}"
        assert await fetch(f"{base}/alerts") == (
            200, "text/html; charset=utf-8", b"<!DOCTYPE html><p>list</p>")  # fmt: skip
        status, _, body = await fetch(f"{base}/alerts/fw-1")
        assert (status, body) == (200, b"<!DOCTYPE html><p>fw-1</p>")
        assert (await fetch(f"{base}/alerts/fw-2"))[0] == 404
        assert (await fetch(f"{base}/alerts/fw-1", "POST"))[0] == 405
        assert (await fetch(f"http://127.0.0.1:{without.port}/alerts"))[0] == 404
    finally:
        await with_pages.close()
        await without.close()
