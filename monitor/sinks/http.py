"""The one asynchronous HTTP client every HTTP sink of a daemon shares (aiohttp).

`assemble` creates one `Http` per daemon and closes it after the sinks, so all
receivers share one connection pool and nothing blocks a thread. A sink built
without one (tests, scripts) makes its own and closes it itself.
"""

from __future__ import annotations

import aiohttp

from monitor import __version__
from monitor.errors import SinkError, SinkRejected

USER_AGENT = f"flopwatch/{__version__}"
_DETAIL = 300  # characters of a refusal's body kept for the log


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (the HTTP-date form is ignored: backoff applies)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86_400 else None


class Http:
    """A lazily opened `aiohttp.ClientSession` with a POST that classifies failures."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        """POST; returns on 2xx. Raises SinkError (retry later: no answer, timeout, 408,
        429, 5xx) or SinkRejected (any other status: the payload itself was refused)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers={"User-Agent": USER_AGENT})
        try:
            async with self._session.post(
                url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                if resp.status < 300:
                    await resp.read()
                    return
                detail = (await resp.text(errors="replace"))[:_DETAIL]
                status, retry_after = resp.status, resp.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SinkError(f"{type(exc).__name__}: {exc}"[:_DETAIL]) from None
        if status in (408, 429) or status >= 500:
            raise SinkError(f"HTTP {status}: {detail}", _retry_after(retry_after))
        raise SinkRejected(f"HTTP {status}: {detail}")

    async def close(self) -> None:
        """Close the session (its pooled connections)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
