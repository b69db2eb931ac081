"""structlog setup: JSON lines in production (or when asked), readable console in a terminal.

Logs go to stderr so that stdout stays clean for data (replay's JSONL alerts).
Context (component, partition, device, layer) is bound by callers with
`log.bind(...)`; nothing logs inside per-sample loops.
"""

from __future__ import annotations

import logging
import sys
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
    # aiokafka logs through stdlib logging; keep its noise at warning and on stderr.
    logging.basicConfig(
        level=logging.WARNING, stream=out, format="%(levelname)s %(name)s %(message)s"
    )


def get_logger(component: str, **context: object) -> structlog.typing.FilteringBoundLogger:
    """A logger bound with its component name and any extra context."""
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger().bind(
        component=component, **context
    )
    return log
