"""A broker that is down must not flood the log: a repeated line is said once a minute."""

from __future__ import annotations

import logging

from monitor.log import RepeatFilter


def _record(msg: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("aiokafka", level, __file__, 1, msg, None, None)


def test_repeats_are_dropped_then_counted() -> None:
    now = [0.0]
    f = RepeatFilter(window_s=60.0, clock=lambda: now[0])
    passed = []
    for second in range(130):
        now[0] = float(second)
        for _ in range(120):  # about what aiokafka logs per second while the broker is down
            rec = _record("Unable connect to %s")
            if f.filter(rec):
                passed.append(rec.getMessage())
    assert passed[0] == "Unable connect to %s"
    assert len(passed) == 3  # at 0 s, 60 s and 120 s
    assert passed[1].endswith("(repeated 7199 more times in the last run)")
    other = _record("Another message")
    assert f.filter(other)  # a new state is said at once
