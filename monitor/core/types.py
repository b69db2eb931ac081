"""Values that cross the core's boundary: raw messages in, alerts and dead letters out."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from monitor.arrays import F64
from monitor.core.stream_table import Frame
from monitor.wire import Alert


class RawMessage(msgspec.Struct, frozen=True, gc=False):
    """One undecoded record and where it came from (offset -1 when not from Kafka).

    A struct rather than a frozen dataclass: one is made per record the source hands
    over, and a frozen dataclass's __init__ costs about ten times as much. Untracked by
    the cycle collector: it holds only strings, numbers and bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A rejected input and why; goes to the dead-letter topic unchanged plus the reason."""

    message: RawMessage
    reason: str


@dataclass(slots=True)
class Output:
    """What one batch produced."""

    alerts: list[Alert] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    # With `kafka.fleet_stage`: this batch's reports for the fleet stage (`core.fleet`), to
    # publish on the change-point topic in order; none when the batch held no window record.
    reports: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class NormView:
    """One partition's frame with its values as the detectors saw them (load-normalised)."""

    partition: int
    frame: Frame
    norm: dict[str, F64]  # by device stream kind ("layer", "device"): the values matrix
