"""The daemon's HTTP endpoints on aiohttp's web server, in the daemon's own event loop.

- `/healthz`: 200 whenever the event loop answers (a wedged loop cannot).
- `/readyz`: 200 once `ready()` holds (partitions assigned, checkpoints restored,
  a poll done), else 503.
- `/metrics`: the injected registry in the Prometheus text format. Collectors run
  on the event loop, between batches, so they read consistent state.
- `/alerts`, `/alerts/<id>`: the open and recent incidents as HTML pages (read-only; what
  Alertmanager's generatorURL and the console line link to), when pages are given.

GET and HEAD only; anything else is 405.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from monitor.log import get_logger

_TEXT = "text/plain"
_HTML = "text/html"
# A slow or silent client must not hold a connection open forever.
_KEEPALIVE_S = 5.0
_MAX_HEAD = 16 * 1024
_NOT_FOUND = "not found: try /healthz, /readyz, /metrics, /alerts\n"


class Pages(Protocol):
    """The incident pages (`monitor.daemon.live.LivePages`)."""

    def index(self) -> str:
        """The list of open and recent incidents."""
        ...

    def page(self, alert_id: str) -> str | None:
        """One incident's page, or None for an id this daemon does not hold."""
        ...


def _text(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type=_TEXT, charset="utf-8")


async def _no_server_header(_: web.Request, response: web.StreamResponse) -> None:
    """No software versions to whoever scans the port."""
    response.headers.popall("Server", None)


class HttpServer:
    """Serves the endpoints on `host:port` (port 0: any free port)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        host: str = "127.0.0.1",
        port: int = 0,
        pages: Pages | None = None,
    ) -> None:
        self.registry = registry
        self.ready = ready
        self.host = host
        self.port = port
        self.pages = pages
        self.log = get_logger("http")
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        """The routes (HEAD is served wherever GET is)."""
        app = web.Application(
            middlewares=[self._errors],
            handler_args={"max_line_size": _MAX_HEAD, "max_field_size": _MAX_HEAD},
        )
        app.on_response_prepare.append(_no_server_header)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/alerts", self._index)
        app.router.add_get("/alerts/{alert_id}", self._page)
        return app

    async def start(self) -> None:
        """Bind and start serving (OSError if the address is taken)."""
        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, keepalive_timeout=_KEEPALIVE_S
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        self.log.info("serving", host=self.host, port=self.port)

    async def close(self) -> None:
        """Stop accepting and close the listening socket."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """404 and 405 as short text; a failing handler (a broken collector) is a logged 500,
        never the end of the server."""
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed:
            return web.Response(
                text="only GET and HEAD\n",
                status=405,
                content_type=_TEXT,
                charset="utf-8",
                headers={"Allow": "GET, HEAD"},
            )
        except web.HTTPNotFound:
            return _text(_NOT_FOUND, 404)
        except web.HTTPException:
            raise
        except Exception:  # a broken collector or page must not take the server down
            self.log.exception("request failed", path=request.path)
            return _text("internal error\n", 500)

    async def _healthz(self, _: web.Request) -> web.Response:
        return _text("ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        return _text("ready\n") if self.ready() else _text("not ready\n", 503)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _index(self, _: web.Request) -> web.Response:
        if self.pages is None:
            return _text(_NOT_FOUND, 404)
        return web.Response(text=self.pages.index(), content_type=_HTML, charset="utf-8")

    async def _page(self, request: web.Request) -> web.Response:
        if self.pages is None:
            return _text(_NOT_FOUND, 404)
        body = self.pages.page(request.match_info["alert_id"])
        if body is None:
            return _text(
                "no such incident here (it may have been resolved long ago, or be "
                "held by another replica): see /alerts\n",
                404,
            )
        return web.Response(text=body, content_type=_HTML, charset="utf-8")


async def serve_http(
    port: int,
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    host: str,
    pages: Pages | None = None,
) -> HttpServer | None:
    """A started server on `port`, or None when `port` is 0 (disabled) or cannot be bound.

    A port that cannot be bound is logged as an error, not raised: alerting matters
    more than its own metrics, and the failing liveness probe still tells.
    """
    if port == 0:
        return None
    server = HttpServer(registry, ready, host, port, pages)
    try:
        await server.start()
    except OSError as exc:
        get_logger("http").error("cannot serve /metrics", host=host, port=port, error=str(exc))
        return None
    return server
