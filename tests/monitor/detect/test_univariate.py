"""`flopwatch detect`'s engine: one number per line in, change-point indices out."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.detect import finite
from monitor.detect.univariate import detect_series, finite_found, main_stdin


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
    assert detect_series([level] * n, finite=True) == []
    assert detect_series([None] * n, finite=True) == []


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


def test_a_value_beyond_float32_is_rejected() -> None:
    """The engine keeps recent samples as float32: 1e39 would become inf there."""
    err = io.StringIO()
    assert main_stdin(io.StringIO("1\n-3e38\n1e39\n"), io.StringIO(), stderr=err) == 2
    assert err.getvalue() == (
        "flopwatch detect: error: line 3: expected a number within ±3.4e+38, got '1e39'\n"
    )


@pytest.mark.slow  # tens of seconds: make test-slow and CI run it
def test_offset_series_needs_the_relative_floors_off() -> None:
    """The daemon's defaults judge a change relative to the level: 2 sd at level 1000 is 0.2%,
    below `min_rel_change` (3%). With it at 0 the same steps are found as at level 0."""
    found = {}
    for level in (0.0, 1000.0):
        for params in ({}, {"min_rel_change": 0.0}):
            hits = 0
            for seed in range(8):
                x = level + np.random.default_rng(seed).standard_normal(3000)
                x[2000:] += 2.0
                hits += any(2000 <= i < 2100 for i in detect_series(list(x), params=params))
            found[level, bool(params)] = hits
    assert found[0.0, False] >= 6
    assert found[1000.0, False] == 0
    assert found[1000.0, True] == found[0.0, True] >= 6


def test_details_give_detection_index_levels_and_score() -> None:
    """--details: one JSON object per change point; onsets as in the plain output."""
    lines = "".join(f"{v}\n" if v is not None else "\n" for v in two_steps())
    out = io.StringIO()
    assert main_stdin(io.StringIO(lines), out, details=True) == 0
    found = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [f["onset"] for f in found] == [300, 450]
    for f, (before, after) in zip(found, [(10.0, 13.0), (13.0, 7.0)], strict=True):
        assert f["onset"] <= f["detected"] <= f["onset"] + 10
        assert abs(f["before"] - before) < 0.3
        assert abs(f["after"] - after) < 1.0
        assert f["score"] >= 1.0


def short_step(seed: int) -> list[float | None]:
    """60 points at level 10, +3 sigma from sample 35: a CI benchmark history."""
    x = 10.0 + np.random.default_rng(seed).standard_normal(60)
    x[35:] += 3.0
    return [float(v) for v in x]


def test_finite_finds_a_step_in_60_points() -> None:
    """Every seed finds the step within 3 samples; at most 2 of 20 add a false alarm."""
    found = [detect_series(short_step(seed), finite=True) for seed in range(20)]
    assert all(any(abs(i - 35) <= 3 for i in f) for f in found), found
    assert sum(len(f) > 1 for f in found) <= 2, found


def ar1_heavy_tailed(seed: int, n: int = 200, phi: float = 0.5) -> list[float | None]:
    """AR(1) noise with t(3) innovations around 50, no change."""
    e = np.random.default_rng(seed).standard_t(3, n)
    x = np.empty(n)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return [float(v) for v in 50.0 + x]


def test_finite_is_quiet_on_autocorrelated_heavy_tailed_noise() -> None:
    """No change: at most 1 in 10 of 60 seeds reports any (measured: 7 of 100)."""
    alarmed = sum(bool(detect_series(ar1_heavy_tailed(seed), finite=True)) for seed in range(60))
    assert alarmed <= 6


def growth_curve(seed: int, n: int = 300, order: int = 2) -> list[float | None]:
    """A cumulative count whose rate wanders: AR(0.5) noise summed `order` times."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n)
    x = np.empty(n)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = 0.5 * x[i - 1] + e[i]
    for _ in range(order):
        x = np.cumsum(x)
    return [float(v) for v in 1000.0 + x]


@pytest.mark.parametrize("order", [2, 3])
def test_finite_is_quiet_on_smooth_growth_curves(order: int) -> None:
    """A twice- or thrice-integrated curve (a cumulative counter, a population) bends
    without stepping: no change points (a line-plus-step test alarmed on all 20)."""
    assert [detect_series(growth_curve(seed, order=order), finite=True) for seed in range(20)] == [
        []
    ] * 20


def test_only_a_wandering_slope_counts_as_integrated_twice() -> None:
    """Steps, AR noise and random walks keep their test; a smooth curve does not."""
    assert not finite.integrated_twice(np.asarray(short_step(0)))
    assert not finite.integrated_twice(np.asarray(ar1_heavy_tailed(0, phi=0.9)))
    walk = np.cumsum(np.random.default_rng(0).standard_normal(300))
    assert not finite.integrated_twice(walk)
    assert finite.integrated_twice(np.asarray(growth_curve(0)))


def test_finite_sizes_burn_in_and_threshold_to_the_length() -> None:
    """Burn-in: a tenth of the series, at least 8; threshold: one false alarm per series."""
    assert [finite.burn_in(n) for n in (15, 80, 81, 500)] == [8, 8, 9, 50]
    from statistics import NormalDist  # noqa: PLC0415

    for n in (50, 500):
        assert 2 * (1 - NormalDist().cdf(finite.threshold(n))) * n * n / 2 == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)), min_size=0, max_size=150
    ),
    shift_at=st.integers(0, 150),
    shift=st.floats(-1e3, 1e3),
)
def test_finite_found_are_causal_and_inside(
    values: list[float | None], shift_at: int, shift: float
) -> None:
    """Onset <= detected, both inside the series, onsets and detections increasing."""
    values = [v if v is None or i < shift_at else v + shift for i, v in enumerate(values)]
    found = finite_found(values)
    for f in found:
        assert 0 <= f.onset <= f.detected < len(values)
        assert values[f.onset] is not None
        assert f.score > 1.0
    assert [f.onset for f in found] == sorted({f.onset for f in found})
    assert [f.detected for f in found] == sorted({f.detected for f in found})


def test_finite_is_online() -> None:
    """A detection at sample t does not depend on samples after t (only on the length)."""
    values = short_step(0)
    full = finite_found(values)
    assert full
    for f in full:
        cut = values[: f.detected + 1] + [None] * (len(values) - f.detected - 1)
        assert finite_found(cut)[-1] == f


def test_finite_stdin_prints_once_the_input_ends() -> None:
    """main_stdin(finite=True): the onsets (or details) of the whole input, exit 0."""
    lines = "".join(f"{v}\n" for v in short_step(1))
    out = io.StringIO()
    assert main_stdin(io.StringIO(lines), out, finite=True, details=True) == 0
    found = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [f["onset"] for f in found] == detect_series(short_step(1), finite=True)
    assert all(f["onset"] <= f["detected"] for f in found)
