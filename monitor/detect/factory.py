"""The factory that builds, restores and re-tunes a detector by kind.

Kinds: ``bank`` (the default engine, `monitor.detect.bank`), ``cusum`` (the
simple CUSUM), and river's ``adwin``, ``page_hinkley`` and ``kswin``
(baselines, one river object per cell). Every detector's `snapshot()` carries
its kind, so `restore_detector` needs nothing but the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monitor.detect import _blob
from monitor.detect.bank import BankCusum
from monitor.detect.base import Detector, StateShapeError
from monitor.detect.cusum import Cusum
from monitor.detect.river import Adwin, Kswin, PageHinkley

DEFAULT_KIND = "bank"
# A new kind: its class here (and its name in `DetectorSettings.kind`).
REGISTRY: dict[str, type[Detector]] = {
    cls.kind: cls for cls in (BankCusum, Cusum, Adwin, PageHinkley, Kswin)
}
KINDS: tuple[str, ...] = tuple(REGISTRY)


def detector_class(kind: str) -> type[Detector]:
    """The class of a kind (ValueError naming the valid kinds)."""
    try:
        return REGISTRY[kind]
    except KeyError:
        raise ValueError(
            f"unknown detector kind {kind!r}; valid kinds: {', '.join(KINDS)}"
        ) from None


def detector_params(kind: str) -> tuple[str, ...]:
    """The parameter names `make_detector` accepts for a kind."""
    return tuple(detector_class(kind).param_types())


def make_detector(
    kind: str, n_metrics: int, params: Mapping[str, float | int] | None = None
) -> Detector:
    """A detector of `kind` for `n_metrics` columns; unknown kinds/parameters raise ValueError.

    Counts may come as whole floats (TOML and the environment give floats): they are made
    ints here, and a fraction (a window count of 20.7 is a mistake, not 20) is refused.
    """
    cls = detector_class(kind)
    types = cls.param_types()
    kw: dict[str, Any] = dict(params or {})
    unknown = sorted(set(kw) - set(types))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for detector kind {kind!r}; valid: {', '.join(types)}"
        )
    for name, value in kw.items():
        if types[name] is int and isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"{name} must be a whole number, got {value}")
            kw[name] = int(value)
    return cls(n_metrics, **kw)


def restore_detector(blob: bytes) -> Detector:
    """Rebuild any detector from its `snapshot()` bytes, dispatching on the kind tag."""
    kind = _blob.kind_of(blob)
    if kind is None:
        raise ValueError("not a detector checkpoint (no kind tag)")
    if kind not in REGISTRY:
        raise ValueError(
            f"checkpoint of unknown detector kind {kind!r}; valid kinds: {', '.join(KINDS)}"
        )
    return REGISTRY[kind].restore(blob)


def restore_configured(
    blob: bytes, kind: str, n_metrics: int, params: Mapping[str, float | int] | None = None
) -> tuple[Detector, str]:
    """A checkpointed detector under the configured kind and parameters, and how it went.

    ``kept``: the checkpoint was written with these parameters. ``retuned``: its state
    carries on under the configured parameters (a bank's new `h` applies from the next
    window). ``reset``: a fresh detector, because the kind, the metric count or a
    parameter that shapes the state (the kind's `restore` says which) differs from the
    checkpoint's.
    """
    configured = make_detector(kind, n_metrics, params)
    saved = restore_detector(blob)
    if saved.kind != kind or saved.n_metrics != n_metrics:
        return configured, "reset"
    want = configured.params()
    if saved.params() == want:
        return saved, "kept"
    try:
        return type(saved).restore(blob, params=want), "retuned"
    except StateShapeError:
        return configured, "reset"
