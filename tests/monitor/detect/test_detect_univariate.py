"""`flopwatch detect`'s engine: one number per line in, change-point indices out."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.detect.univariate import detect_series, main_stdin


def two_steps(seed: int = 0) -> list[float | None]:
    """Level 10, +3 sigma at 300, -6 sigma at 450, one missing value early on."""
    rng = np.random.default_rng(seed)
    x = 10.0 + rng.standard_normal(600)
    x[300:] += 3.0
    x[450:] -= 6.0
    values: list[float | None] = [float(v) for v in x]
    values[100] = None
    return values


def test_finds_both_steps_at_their_first_new_sample() -> None:
    """Indices are 0-based and point at the first sample of the new level."""
    assert detect_series(two_steps()) == [300, 450]


@pytest.mark.parametrize("kind", ["cusum", "adwin", "page_hinkley", "kswin"])
def test_other_kinds_work_too(kind: str) -> None:
    """The same entry point runs every detector kind; each finds something near each step."""
    found = detect_series(two_steps(), kind=kind)
    assert any(250 <= i <= 330 for i in found)
    assert any(400 <= i <= 480 for i in found)


@settings(max_examples=25, deadline=None)
@given(level=st.floats(-1e9, 1e9), n=st.integers(0, 400))
def test_constant_input_has_no_change_points(level: float, n: int) -> None:
    """A constant (or empty, or all-missing) series has no change points."""
    assert detect_series([level] * n) == []
    assert detect_series([None] * n) == []


def test_stdin_streams_indices_and_treats_empty_lines_as_missing() -> None:
    """Lines are parsed as numbers (whitespace allowed); an empty line is a missing window."""
    lines = [f"  {v} \n" if v is not None else "\n" for v in two_steps()]
    out = io.StringIO()
    assert main_stdin(io.StringIO("".join(lines)), out) == 0
    assert out.getvalue() == "300\n450\n"


def test_bad_line_is_one_error_line_and_exit_2() -> None:
    """The first non-numeric line stops the run with exactly one error line on stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = main_stdin(io.StringIO("1.0\n\n2.5\nabc\n3\nxyz\n"), out, stderr=err)
    assert code == 2
    assert err.getvalue() == "flopwatch detect: error: line 4: expected a number, got 'abc'\n"
    assert out.getvalue() == ""


def test_infinity_is_rejected_like_text() -> None:
    """inf is not a measurement; nan spells a missing window."""
    err = io.StringIO()
    assert main_stdin(io.StringIO("nan\ninf\n"), io.StringIO(), stderr=err) == 2
    assert "line 2: expected a number, got 'inf'" in err.getvalue()
