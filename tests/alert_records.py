"""Alert records of one real incident (firing, then resolved), from the pure pipeline."""

from __future__ import annotations

import functools

from factories import fleet

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.wire import Alert


@functools.cache
def incident() -> tuple[Alert, ...]:
    """Every record of one paged kernel-fallback incident on pool train-a, in order."""
    p = Pipeline(Settings())
    out: list[Alert] = []
    for b in fleet(80, regress_at=40, change_at=39) + fleet(130, seed=9)[80:]:
        out.extend(p.process(b).alerts)
    assert {a.status for a in out} == {"firing", "resolved"}
    assert len({a.id for a in out}) == 1
    return tuple(out)


def firing() -> Alert:
    """The last firing record."""
    return [a for a in incident() if a.status == "firing"][-1]


def resolved() -> Alert:
    """The resolving record."""
    return next(a for a in incident() if a.status == "resolved")
