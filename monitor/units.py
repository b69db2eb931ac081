"""The one grammar for durations and speeds on every command line (`flopwatch`, `sim`)."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in `90s`, `20m`, `2h`, `1d` or plain seconds; raises ValueError."""
    m = _DURATION.match(text.lower())
    if m is None:
        raise ValueError(f"bad duration {text!r} (use e.g. 90s, 20m, 2h, 1d or seconds)")
    secs = float(m.group(1)) * _UNIT_S[m.group(2)]
    if secs <= 0:
        raise ValueError(f"duration must be > 0, got {text!r}")
    return secs


def parse_speed(text: str) -> float | None:
    """None for `max` (as fast as possible), else a factor > 0 (`1` = real time, `10x`)."""
    t = text.strip().lower()
    if t in {"max", "inf", "fast"}:
        return None
    t = t.removesuffix("x")
    try:
        v = float(t)
    except ValueError:
        raise ValueError(f"bad speed {text!r} (use max, 1 for real time, or a factor)") from None
    if not v > 0:
        raise ValueError(f"speed must be > 0, got {text!r}")
    return v
