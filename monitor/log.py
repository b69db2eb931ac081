"""structlog setup: JSON lines in production (or when asked), readable console in a terminal.

Logs go to stderr so that stdout stays clean for data (replay's JSONL alerts).
Context (component, partition, device, layer) is bound by callers with
`log.bind(...)`; nothing logs inside per-sample loops.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Literal, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}  # fmt: skip


def configure_logging(
    fmt: Literal["auto", "json", "console"] = "auto",
    level: str = "info",
    stream: TextIO | None = None,
) -> None:
    """Configure structlog once per process; `auto` picks console only for a terminal."""
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # aiokafka logs through stdlib logging; keep its noise at warning and on stderr, and
    # say a repeated error once per minute with a count (a down broker: ~120 lines/s).
    logging.basicConfig(
        level=logging.WARNING, stream=out, format="%(levelname)s %(name)s %(message)s"
    )
    kafka_log = logging.getLogger("aiokafka")
    if not any(isinstance(f, RepeatFilter) for f in kafka_log.filters):
        kafka_log.addFilter(RepeatFilter())


class RepeatFilter(logging.Filter):
    """Passes the first of a run of same-template records, drops the rest for `window_s`,
    then passes the next one saying how many were dropped."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window_s, self.clock = window_s, clock
        self._seen: dict[tuple[str, int, object], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True to emit `record` (with the count of those dropped before it)."""
        key = (record.name, record.levelno, record.msg)
        now = self.clock()
        first, dropped = self._seen.get(key, (-math.inf, 0))
        if now - first < self.window_s:
            self._seen[key] = (first, dropped + 1)
            return False
        self._seen[key] = (now, 0)
        if dropped:
            record.msg = f"{record.msg} (repeated {dropped} more times in the last run)"
        return True


def get_logger(component: str, **context: object) -> structlog.typing.FilteringBoundLogger:
    """A logger bound with its component name and any extra context."""
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger().bind(
        component=component, **context
    )
    return log
