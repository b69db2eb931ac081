"""The factory that builds, restores and re-tunes a detector by kind.

Kinds: ``bank`` (the default engine, `monitor.detect.bank`), ``cusum`` (the
simple placeholder), and river's ``adwin``, ``page_hinkley`` and ``kswin``
(baselines, one river object per cell). Every detector's `snapshot()` carries
its kind, so `restore_detector` needs nothing but the bytes.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np

from monitor.detect import _blob
from monitor.detect.bank import BankCusum
from monitor.detect.bank_params import param_types as bank_param_types
from monitor.detect.base import Detector
from monitor.detect.cusum import Cusum
from monitor.detect.river import RiverDetector, river_params

DEFAULT_KIND = "bank"
KINDS: tuple[str, ...] = ("bank", "cusum", *RiverDetector.KINDS)


class TaggedCusum(Cusum):
    """The placeholder CUSUM with a kind-tagged checkpoint, so the factory can restore it."""

    kind = "cusum"

    def snapshot(self) -> bytes:
        """The placeholder's own bytes inside the tagged envelope."""
        raw = np.frombuffer(super().snapshot(), dtype=np.uint8)
        return _blob.pack(self.kind, {}, {"npz": raw})

    @classmethod
    def restore(cls, blob: bytes) -> TaggedCusum:
        """Rebuild from `snapshot` bytes (tagged or the placeholder's raw .npz)."""
        if _blob.kind_of(blob) is not None:
            _, arrays = _blob.unpack(blob, cls.kind)
            blob = arrays["npz"].tobytes()
        det = super().restore(blob)
        assert isinstance(det, TaggedCusum)  # noqa: S101 - Cusum.restore builds `cls`
        return det


def _ctor_params(cls: type) -> tuple[str, ...]:
    sig = inspect.signature(cls)
    return tuple(name for name, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY)


def detector_params(kind: str) -> tuple[str, ...]:
    """The parameter names `make_detector` accepts for a kind."""
    if kind == "bank":
        return (*bank_param_types(), "capacity")
    if kind == "cusum":
        return _ctor_params(Cusum)
    if kind in RiverDetector.KINDS:
        return (*_ctor_params(RiverDetector), *river_params(kind))
    raise ValueError(f"unknown detector kind {kind!r}; valid kinds: {', '.join(KINDS)}")


def make_detector(
    kind: str, n_metrics: int, params: Mapping[str, float | int] | None = None
) -> Detector:
    """A detector of `kind` for `n_metrics` columns; unknown kinds/parameters raise ValueError."""
    kw: dict[str, Any] = dict(params or {})
    valid = detector_params(kind)
    unknown = sorted(set(kw) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for detector kind {kind!r}; valid: {', '.join(valid)}"
        )
    cls: type = BankCusum if kind == "bank" else Cusum if kind == "cusum" else RiverDetector
    types = (
        {**bank_param_types(), "capacity": int}
        if kind == "bank"
        else {name: type(p.default) for name, p in inspect.signature(cls).parameters.items()}
    )
    for name, kind_of in types.items():
        # Config gives floats (TOML, env); a window count of 20.7 is a mistake, not 20.
        value = kw.get(name)
        if kind_of is int and isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"{name} must be a whole number, got {value}")
            kw[name] = int(value)
    if kind == "bank":
        return BankCusum(n_metrics, **kw)
    if kind == "cusum":
        return TaggedCusum(n_metrics, **kw)
    return RiverDetector(kind, n_metrics, **kw)


def restore_detector(blob: bytes) -> Detector:
    """Rebuild any detector from its `snapshot()` bytes, dispatching on the kind tag."""
    kind = _blob.kind_of(blob)
    if kind is None:
        if blob[:2] == b"PK":  # an untagged placeholder checkpoint (.npz)
            return TaggedCusum.restore(blob)
        raise ValueError("not a detector checkpoint (no kind tag)")
    if kind == "bank":
        return BankCusum.restore(blob)
    if kind == "cusum":
        return TaggedCusum.restore(blob)
    if kind in RiverDetector.KINDS:
        return RiverDetector.restore(blob)
    raise ValueError(
        f"checkpoint of unknown detector kind {kind!r}; valid kinds: {', '.join(KINDS)}"
    )


def _settings_of(det: Detector) -> Any:
    """What a detector was built with, comparable across instances of its class."""
    if isinstance(det, BankCusum):
        return det.params()
    if isinstance(det, RiverDetector):
        return (det.history, det.min_rel_change, det.abs_floor, det.river_params)
    if isinstance(det, Cusum):
        return (det.burn_in, det.k, det.h, det.clip, det.rel_floor, det.min_rel_change)
    raise TypeError(f"unknown detector {type(det).__name__}")


def restore_configured(
    blob: bytes, kind: str, n_metrics: int, params: Mapping[str, float | int] | None = None
) -> tuple[Detector, str]:
    """A checkpointed detector under the configured kind and parameters, and how it went.

    ``kept``: the checkpoint was written with these parameters. ``retuned``: a bank's state
    carries on under the configured parameters (a new `h` applies from the next window).
    ``reset``: a fresh detector, because the kind, the metric count or a parameter that
    shapes the state (`BankCusum.STATE_SHAPE`; any parameter of the other kinds, whose
    state lives in per-cell objects built with them) differs from the checkpoint's.
    """
    configured = make_detector(kind, n_metrics, params)
    saved = restore_detector(blob)
    same_kind = type(saved) is type(configured) and getattr(saved, "kind", None) == kind
    if not same_kind or getattr(saved, "n_metrics", None) != n_metrics:
        return configured, "reset"
    have, want = _settings_of(saved), _settings_of(configured)
    if have == want:
        return saved, "kept"
    if isinstance(configured, BankCusum) and all(have[k] == want[k] for k in BankCusum.STATE_SHAPE):
        return BankCusum.restore(blob, params=want), "retuned"
    return configured, "reset"
