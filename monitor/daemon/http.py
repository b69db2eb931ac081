"""/healthz, /readyz and /metrics on a tiny asyncio HTTP/1.1 server (no web framework).

- `/healthz`: 200 whenever the event loop answers (a wedged loop cannot).
- `/readyz`: 200 once `ready()` holds (partitions assigned, checkpoints restored,
  a poll done), else 503.
- `/metrics`: the injected registry in the Prometheus text format. Collectors run
  on the event loop, between batches, so they read consistent state.

One request per connection (`Connection: close`), GET and HEAD only: that is all
that probes and Prometheus need, and it keeps the parser to a few lines.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from monitor.log import get_logger

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip
_TEXT = "text/plain; charset=utf-8"
# A slow or silent client must not hold a connection open forever.
_READ_TIMEOUT_S = 5.0
_MAX_HEAD = 16 * 1024


class HttpServer:
    """Serves the health and metrics endpoints on `host:port` (port 0: any free port)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.registry = registry
        self.ready = ready
        self.host = host
        self.port = port
        self.log = get_logger("http")
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Bind and start serving (OSError if the address is taken)."""
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, limit=_MAX_HEAD
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.log.info("serving", host=self.host, port=self.port)

    async def close(self) -> None:
        """Stop accepting and close the listening socket."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def respond(self, method: str, target: str) -> tuple[int, str, bytes]:
        """Status, content type and body for one request."""
        if method not in ("GET", "HEAD"):
            return 405, _TEXT, b"only GET and HEAD\n"
        path = target.split("?", 1)[0]
        if path == "/healthz":
            return 200, _TEXT, b"ok\n"
        if path == "/readyz":
            return (200, _TEXT, b"ready\n") if self.ready() else (503, _TEXT, b"not ready\n")
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        return 404, _TEXT, b"not found: try /healthz, /readyz, /metrics\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):  # fmt: skip
            writer.close()
            return
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        method = parts[0] if parts else ""
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            status, ctype, body = 400, _TEXT, b"bad request\n"
        else:
            try:
                status, ctype, body = self.respond(method, parts[1])
            except Exception:  # a broken collector must not take the server down
                self.log.exception("request failed", path=parts[1])
                status, ctype, body = 500, _TEXT, b"internal error\n"
        extra = "Allow: GET, HEAD\r\n" if status == 405 else ""
        writer.write(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode()
        )
        if method != "HEAD":
            writer.write(body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def serve_http(
    port: int, registry: CollectorRegistry, ready: Callable[[], bool], host: str
) -> HttpServer | None:
    """A started server on `port`, or None when `port` is 0 (disabled) or cannot be bound.

    A port that cannot be bound is logged as an error, not raised: alerting matters
    more than its own metrics, and the failing liveness probe still tells.
    """
    if port == 0:
        return None
    server = HttpServer(registry, ready, host, port)
    try:
        await server.start()
    except OSError as exc:
        get_logger("http").error("cannot serve /metrics", host=host, port=port, error=str(exc))
        return None
    return server
