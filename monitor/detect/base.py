"""The detector seam: vectorised online change-point detection over many streams.

A detector holds state for `capacity` streams × `K` metrics as numpy arrays.
`update` takes at most one sample per stream (a *wave*): row ids, event times
and a (n, K) value matrix where NaN means "not measured this window" and leaves
that cell's state untouched. Detections come back as a struct of arrays; after
a detection the cell re-baselines on the new level.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self

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
    # When the first shifted sample was seen (its window's end): with a gap in the data
    # between it and `onset_ts`, the shift began anywhere in the gap. None or NaN: not
    # kept (detectors that keep no sample times), read as the window after the onset.
    first_bad_ts: F64 | None = None

    def first_bad(self, window_s: float) -> F64:
        """`first_bad_ts`, or the end of the window after the onset where not kept."""
        after = self.onset_ts + window_s
        if self.first_bad_ts is None:
            return after
        return np.where(np.isfinite(self.first_bad_ts), self.first_bad_ts, after)

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

        def cat(f: str) -> Any:
            return np.concatenate([getattr(p, f) for p in parts])

        kept = any(p.first_bad_ts is not None for p in parts)
        return cls(
            cat("rows"), cat("cols"), cat("detected_ts"), cat("onset_ts"), cat("before"),
            cat("after"), cat("score"),
            first_bad_ts=np.concatenate(
                [np.full(len(p), np.nan) if p.first_bad_ts is None else p.first_bad_ts
                 for p in parts]
            ) if kept else None,
        )  # fmt: skip


class StateShapeError(ValueError):
    """A checkpoint's state cannot carry on under the parameters asked for."""


class Detector(Protocol):
    """Online change-point detector over `capacity` streams × K metric columns.

    A kind is one class: `kind` names it in checkpoints and in the config, and its
    constructor takes `(n_metrics, **params)` with the keywords of `param_types()`.
    """

    kind: ClassVar[str]

    def __init__(self, n_metrics: int, **params: Any) -> None:
        """A detector for `n_metrics` columns; `params` as in `param_types()`."""

    @property
    def n_metrics(self) -> int:
        """Metric columns per stream."""
        ...

    @property
    def capacity(self) -> int:
        """Stream slots (rows) currently allocated; rows beyond it grow the state."""
        ...

    @classmethod
    def param_types(cls) -> dict[str, type]:
        """Constructor keywords (`capacity` included) and their types: int for counts."""
        ...

    def params(self) -> dict[str, Any]:
        """Constructor keywords that rebuild this detector (`capacity` aside)."""
        ...

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
        """Serialise the whole state, tagged with `kind`."""
        ...

    @classmethod
    def restore(cls, blob: bytes, params: Mapping[str, Any] | None = None) -> Self:
        """Rebuild from `snapshot` bytes. With `params` (keys of `params()`), the state
        carries on under them, or `StateShapeError` where it cannot."""
        ...

    def drain_stats(self) -> dict[str, int]:
        """Alarms by outcome since the last call ({} for a kind that keeps none)."""
        ...

    def drain_warm_starts(self) -> dict[str, int]:
        """Warm starts by outcome since the last call ({} for a kind without them)."""
        ...


def _number_type(p: inspect.Parameter) -> type:
    ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
    if type(p.default) is int or ann.startswith("int"):
        return int
    if type(p.default) is float or ann.startswith("float"):
        return float
    return object


def keyword_types(fn: Callable[..., object], *, keyword_only: bool = True) -> dict[str, type]:
    """The keyword parameters of `fn` and their types, from defaults and annotations: int
    for counts, float for other numbers, object for anything else."""
    kinds = (
        (inspect.Parameter.KEYWORD_ONLY,)
        if keyword_only
        else (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )
    sig = inspect.signature(fn)
    return {name: _number_type(p) for name, p in sig.parameters.items() if p.kind in kinds}
