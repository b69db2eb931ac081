"""`BankParams`: the bank's one list of parameters, their validation and their types."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.detect import detector_params, make_detector
from monitor.detect.bank import BankCusum
from monitor.detect.bank_params import STATE_SHAPE, BankParams, params_table

# The checkpoint header's parameter names (a snapshot's bytes depend on them).
NAMES = [
    "h", "min_shift", "max_shift", "n_shifts", "clip", "step_cap", "burn_in", "history",
    "youth", "maturity", "baseline_window", "scale_window", "ar_window", "ar_max",
    "ar_margin", "rel_floor", "abs_floor", "min_rel_change", "jump", "jump_windows",
    "spread_veto", "ar2_margin", "lrv_window", "lrv_margin", "ma_max", "warm_start",
]  # fmt: skip


def test_params_are_the_dataclass_fields_in_order() -> None:
    """`params()`, the factory's names and the dataclass agree, in one order."""
    det = BankCusum(1, h=12, burn_in=16)
    assert list(det.params()) == NAMES
    assert det.params() == BankParams(h=12.0, burn_in=16).as_dict()
    assert detector_params("bank") == (*NAMES, "capacity")
    assert type(det.params()["h"]) is float
    assert type(det.params()["burn_in"]) is int


def test_state_shape_is_marked_on_the_fields() -> None:
    """The parameters a checkpoint cannot carry over are the ring, burn-in and the grid."""
    assert set(STATE_SHAPE) == {"history", "burn_in", "min_shift", "max_shift", "n_shifts"}
    assert BankCusum.STATE_SHAPE == STATE_SHAPE


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"h": 0.0}, "h, clip and step_cap must be > 0"),
        ({"min_shift": 3.0}, "0 < min_shift <= max_shift and n_shifts >= 1 required"),
        ({"burn_in": 40}, "3 <= burn_in <= history required"),
        ({"ar_max": 1.0}, "windows >= 1 and 0 <= ar_max < 1 required"),
        ({"lrv_window": -1}, "lrv_window \\(0 = off\\) and lrv_margin >= 0 required"),
        ({"ma_max": 1.0}, "0 <= ma_max < 1 required"),
        ({"warm_start": -1}, "warm_start >= 0 required"),
        ({"jump_windows": 1}, "jump >= 0 \\(0 = off\\) and jump_windows >= 2 required"),
        ({"abs_floor": 0.0}, "abs_floor > 0 required"),
    ],
)
def test_invalid_values_are_refused_with_the_rule(params: dict[str, float], message: str) -> None:
    """Each rule fails at construction, from the dataclass, with the rule in the message."""
    with pytest.raises(ValueError, match=message):
        BankParams(**params)
    with pytest.raises(ValueError, match=message):
        make_detector("bank", 1, params)


def test_counts_must_be_integers() -> None:
    """A count given as a float is the factory's to make whole; the dataclass refuses it."""
    with pytest.raises(TypeError, match=r"burn_in must be an integer, got 32\.0"):
        BankParams(burn_in=32.0)  # type: ignore[arg-type]
    assert make_detector("bank", 1, {"burn_in": 32.0}).params()["burn_in"] == 32


def test_tuning_doc_holds_the_generated_table() -> None:
    """docs/tuning.md carries `params_table()` verbatim between its markers."""
    doc = (Path(__file__).parents[3] / "docs" / "tuning.md").read_text()
    start, end = "<!-- bank-params:start -->\n", "<!-- bank-params:end -->"
    assert doc.count(start) == 1
    assert doc.count(end) == 1
    table = doc.split(start)[1].split(end)[0]
    assert table == params_table(), (
        "docs/tuning.md is out of date: put the output of `python -c 'from "
        'monitor.detect.bank_params import params_table; print(params_table(), end="")\'` '
        "between its bank-params markers"
    )


def test_table_has_one_row_per_parameter() -> None:
    """Name, default, meaning and whether it shapes the state, for every field."""
    rows = params_table().splitlines()[2:]
    assert [row.split(" | ")[0].strip("| `") for row in rows] == NAMES
    assert "| `history` | 32 |" in params_table()
    assert all(row.endswith(("| yes |", "| no |")) for row in rows)
