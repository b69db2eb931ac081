"""Every error flopwatch raises on purpose, under one base class.

`retriable` carries behaviour, as in aiokafka's errors: True when the same call
may succeed later without anyone changing anything (a broker or receiver that is
down), False when input or configuration must change first. The CLI prints any
`FlopwatchError` as one line and exits 2.
"""

from __future__ import annotations

from typing import ClassVar


class FlopwatchError(Exception):
    """Base class; `retriable` says whether trying again later can succeed."""

    retriable: ClassVar[bool] = False


class UsageError(FlopwatchError):
    """Misuse of the CLI: one line on stderr, exit code 2."""


class ConfigError(FlopwatchError, ValueError):
    """The configuration file or environment is unusable; the message is one line."""


class DecodeError(FlopwatchError, ValueError):
    """A record that cannot be accepted; `reason` names the field and what was wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RecordingError(FlopwatchError, ValueError):
    """The recording cannot be read at all (missing, unreadable, bad compression)."""


class ParseError(FlopwatchError, ValueError):
    """A line that is neither empty nor a number the engine can hold."""

    def __init__(self, lineno: int, text: str, why: str = "expected a number") -> None:
        super().__init__(f"line {lineno}: {why}, got {text!r}")
        self.lineno, self.text = lineno, text


class CheckpointError(FlopwatchError):
    """A checkpoint record that cannot be used, or a state topic that cannot be read."""

    retriable = True


class StateVersionError(FlopwatchError):
    """A checkpoint written by another state version: that partition starts fresh."""


class BrokerError(FlopwatchError, RuntimeError):
    """The embedded broker could not be started."""


class SinkError(FlopwatchError, RuntimeError):
    """A receiver could not take a delivery now (down, slow, 429, 5xx): retried later."""

    retriable = True

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s  # what the receiver asked for (Retry-After)


class SinkRejected(SinkError):
    """A receiver rejected the payload itself (4xx other than 408/429): never retried."""

    retriable = False


class IngestError(FlopwatchError, ValueError):
    """An input an ingest adapter cannot read (not a trace, not exposition text, no devices)."""
