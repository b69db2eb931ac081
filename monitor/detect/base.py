"""The detector seam: vectorised online change-point detection over many streams.

A detector holds state for `capacity` streams × `K` metrics as numpy arrays.
`update` takes at most one sample per stream (a *wave*): row ids, event times
and a (n, K) value matrix where NaN means "not measured this window" and leaves
that cell's state untouched. Detections come back as a struct of arrays; after
a detection the cell re-baselines on the new level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from monitor.arrays import F64, I64


@dataclass(frozen=True, slots=True)
class Detections:
    """Change points found in one wave, one entry per (row, metric column)."""

    rows: I64
    cols: I64
    detected_ts: F64
    onset_ts: F64  # estimated change time: end of the last window before the shift
    before: F64  # level before the change (robust baseline)
    after: F64  # level after the change (mean since onset)
    score: F64  # confidence statistic, in units of the decision threshold (>= 1)

    @classmethod
    def empty(cls) -> Detections:
        """No detections."""
        z = np.empty(0)
        zi = np.empty(0, dtype=np.int64)
        return cls(zi, zi, z, z, z, z, z)

    def __len__(self) -> int:
        return int(self.rows.size)

    @classmethod
    def concat(cls, parts: list[Detections]) -> Detections:
        """Join several waves' detections in order."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        return cls(
            *(
                np.concatenate([getattr(p, f) for p in parts])
                for f in ("rows", "cols", "detected_ts", "onset_ts", "before", "after", "score")
            )
        )


class Detector(Protocol):
    """Online change-point detector over `capacity` streams × K metric columns."""

    def update(self, rows: I64, ts: F64, values: F64, groups: I64 | None = None) -> Detections:
        """Feed one wave (each row at most once); return the change points it completed.

        `groups` (optional, one id >= 0 per row) names each stream's family; a detector may
        start a new stream's noise model from its family's (the bank's `warm_start`).
        """
        ...

    def forget(self, rows: I64) -> None:
        """Reset the state of expired streams so their slots can be reused."""
        ...

    def snapshot(self) -> bytes:
        """Serialise the whole state; `restore` of it gives identical future outputs."""
        ...
