"""The one duration and speed grammar of every command line."""

from __future__ import annotations

import pytest

from monitor.units import parse_duration, parse_speed


@pytest.mark.parametrize(
    ("text", "secs"),
    [
        ("90s", 90.0),
        ("20m", 1200.0),
        ("2h", 7200.0),
        ("1.5h", 5400.0),
        ("600", 600.0),
        ("1d", 86400.0),
    ],
)
def test_parse_duration(text: str, secs: float) -> None:
    """Durations accept s / m / h / d suffixes or plain seconds."""
    assert parse_duration(text) == secs


@pytest.mark.parametrize("text", ["", "5q", "-3m", "0", "h2", "2 hours"])
def test_parse_duration_rejects(text: str) -> None:
    """Anything else is a ValueError."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_parse_speed() -> None:
    """max means as fast as possible; numbers (optionally with x) are factors."""
    assert parse_speed("max") is None
    assert parse_speed("1") == 1.0
    assert parse_speed("60x") == 60.0
    for bad in ("0", "-1", "fastest", ""):
        with pytest.raises(ValueError, match="speed"):
            parse_speed(bad)
