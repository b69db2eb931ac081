"""The bank engine's parameters: one frozen dataclass, the single source of their names,
types, defaults, meanings and validation (`BankCusum`, the factory, the config and
docs/tuning.md all derive from it)."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

# The ring holds a sample near its level to float32's rounding (`bank_ring`): a scale under
# that step is rounding noise.
REL_FLOOR_MIN = 2.0**-23


def _meta(doc: str, *, shapes_state: bool = False) -> dict[str, Any]:
    return {"doc": doc, "shapes_state": shapes_state}


@dataclass(frozen=True, slots=True, kw_only=True)
class BankParams:
    """What a `BankCusum` is built with. Field order is `BankCusum.params()`'s key order.

    `shapes_state` marks parameters that size the state or give its arrays their meaning
    (ring length, the bank's members, when burn-in ends): a checkpoint carries over to
    other parameters only where these match.
    """

    h: float = field(
        default=11.0,
        metadata=_meta(
            "decision threshold in log-likelihood-ratio units: higher = fewer false alarms, "
            "later detection"
        ),
    )
    min_shift: float = field(
        default=0.5,
        metadata=_meta("smallest shift of the bank's grid, in sigmas", shapes_state=True),
    )
    max_shift: float = field(
        default=2.0,
        metadata=_meta("largest shift of the bank's grid, in sigmas", shapes_state=True),
    )
    n_shifts: int = field(
        default=3,
        metadata=_meta(
            "shift sizes in the grid, geometric from min_shift to max_shift", shapes_state=True
        ),
    )
    clip: float = field(
        default=2.5, metadata=_meta("bound on one window's standardised innovation, in sigmas")
    )
    step_cap: float = field(
        default=2.5, metadata=_meta("most log-likelihood ratio one window adds to a statistic")
    )
    burn_in: int = field(
        default=32,
        metadata=_meta("samples of a stream before its detection starts", shapes_state=True),
    )
    history: int = field(
        default=32,
        metadata=_meta(
            "ring length in samples: the baseline's lag and the onset search window",
            shapes_state=True,
        ),
    )
    youth: float = field(
        default=16.0,
        metadata=_meta("young baselines' evidence is shrunk by 1 - youth / samples (0 = off)"),
    )
    maturity: float = field(
        default=64.0,
        metadata=_meta("a shift size votes once the level rests on maturity / shift² samples"),
    )
    baseline_window: int = field(
        default=512, metadata=_meta("memory of the level estimate, in samples")
    )
    scale_window: int = field(
        default=1024, metadata=_meta("memory of the scale estimate, in samples")
    )
    ar_window: int = field(
        default=4096,
        metadata=_meta("memory of the AR and long-run variance estimates, in samples"),
    )
    ar_max: float = field(
        default=0.98, metadata=_meta("cap on the AR(1) coefficient used for whitening")
    )
    ar_margin: float = field(
        default=1.0, metadata=_meta("AR(1) coefficient's upper confidence margin, in std errors")
    )
    rel_floor: float = field(
        default=1e-3,
        metadata=_meta("scale floor relative to the level (at least 2^-23, the float32 step)"),
    )
    abs_floor: float = field(
        default=1e-9,
        metadata=_meta("absolute scale floor; stands in for a zero level in the effect test"),
    )
    min_rel_change: float = field(
        default=0.03,
        metadata=_meta("smallest relative effect reported; smaller alarms re-baseline silently"),
    )
    jump: float = field(
        default=6.0, metadata=_meta("jump rule's bound, in marginal sigmas of the level (0 = off)")
    )
    jump_windows: int = field(
        default=3, metadata=_meta("windows in a row beyond `jump` that alarm")
    )
    spread_veto: float = field(
        default=math.sqrt(2.0),
        metadata=_meta(
            "spread ratio (in sd) past which an alarm in a burst of spread is vetoed (0 = off)"
        ),
    )
    ar2_margin: float = field(
        default=1.5,
        metadata=_meta(
            "margin before the lag-2 (ARMA(1,1)) estimate of the AR coefficient wins (0 = off)"
        ),
    )
    lrv_window: int = field(
        default=32,
        metadata=_meta("horizon of the long-run variance deflation, in windows (0 = off)"),
    )
    lrv_margin: float = field(
        default=2.0, metadata=_meta("margin of the long-run variance ratio, in std errors")
    )
    ma_max: float = field(
        default=0.0, metadata=_meta("largest coefficient of the opt-in MA(1) term (0 = off)")
    )
    warm_start: int = field(
        default=0,
        metadata=_meta(
            "credit, in samples, for estimates a joiner borrows from its family (0 = off)"
        ),
    )

    def __post_init__(self) -> None:
        for name, kind in _TYPES.items():
            value = getattr(self, name)
            if kind is int:
                try:
                    value = operator.index(value)
                except TypeError:
                    raise TypeError(f"{name} must be an integer, got {value!r}") from None
            else:
                value = float(value)
            object.__setattr__(self, name, value)
        self._validate()

    def _validate(self) -> None:
        """ValueError naming the first rule the values break."""
        windows = (self.baseline_window, self.scale_window, self.ar_window)
        offs = (self.spread_veto, self.ar2_margin, self.lrv_window, self.lrv_margin)
        nonneg = (self.youth, self.maturity, self.ar_margin, self.rel_floor, self.min_rel_change)
        broken = (
            (
                not (self.h > 0 and self.clip > 0 and self.step_cap > 0),
                "h, clip and step_cap must be > 0",
            ),
            (
                not (0 < self.min_shift <= self.max_shift and self.n_shifts >= 1),
                "0 < min_shift <= max_shift and n_shifts >= 1 required",
            ),
            (not 3 <= self.burn_in <= self.history, "3 <= burn_in <= history required"),
            (
                min(windows) < 1 or not 0 <= self.ar_max < 1,
                "windows >= 1 and 0 <= ar_max < 1 required",
            ),
            (
                any(v < 0 for v in offs),
                "spread_veto, ar2_margin, lrv_window (0 = off) and lrv_margin >= 0 required",
            ),
            (not 0 <= self.ma_max < 1, "0 <= ma_max < 1 required (0 = no MA term)"),
            (self.warm_start < 0, "warm_start >= 0 required (0 = off)"),
            (
                self.jump < 0 or self.jump_windows < 2,
                "jump >= 0 (0 = off) and jump_windows >= 2 required",
            ),
            (
                min(nonneg) < 0 or self.abs_floor <= 0,
                "youth, maturity, ar_margin, rel_floor, min_rel_change >= 0, "
                "abs_floor > 0 required",
            ),
            # A scale under the ring's rounding step near the level would page on rounding noise.
            (
                self.rel_floor < REL_FLOOR_MIN,
                f"rel_floor >= {REL_FLOOR_MIN:.3g} required: the ring holds samples near the level "
                "to float32's step, "
                "so a smaller scale relative to the level is rounding noise",
            ),
        )
        for bad, message in broken:
            if bad:
                raise ValueError(message)

    def as_dict(self) -> dict[str, Any]:
        """The parameters by name, in field order."""
        return {name: getattr(self, name) for name in _TYPES}


_TYPES: dict[str, type] = {f.name: get_type_hints(BankParams)[f.name] for f in fields(BankParams)}
STATE_SHAPE: tuple[str, ...] = tuple(
    f.name for f in fields(BankParams) if f.metadata["shapes_state"]
)


def param_types() -> dict[str, type]:
    """Each parameter's type (int for counts, float else), in field order."""
    return dict(_TYPES)


def _shown(value: Any) -> str:
    text = f"{value:.6g}"
    return text if isinstance(value, int) or any(c in text for c in ".en") else text + ".0"


def params_table() -> str:
    """The parameters as a Markdown table: name, default, meaning, whether it shapes state."""
    lines = [
        "| parameter | default | meaning | shapes state |",
        "| --- | --- | --- | --- |",
    ]
    for f in fields(BankParams):
        shapes = "yes" if f.metadata["shapes_state"] else "no"
        lines.append(f"| `{f.name}` | {_shown(f.default)} | {f.metadata['doc']} | {shapes} |")
    return "\n".join(lines) + "\n"
