"""A change the pool already ran at the onset's load without regressing is not the cause."""

from __future__ import annotations

import math

from monitor.core.exposure import PoolExposure

T0, W = 1_000_000.0, 10.0


def _fill(exp: PoolExposure, pool: str, start: float, end: float, rate: float) -> None:
    t = start
    while t < end:
        exp.observe(pool, t, rate)
        t += W


def test_a_change_hours_before_a_training_pools_onset_was_tested() -> None:
    """No request rate (training): every window after the change is a test it passed."""
    exp = PoolExposure()
    _fill(exp, "train", T0, T0 + 3 * 3600, math.nan)
    assert exp.tested("train", T0 + 60, T0 + 3 * 3600 - 600, T0 + 3 * 3600 - 570, W, 6)
    # right before the onset: not enough clean windows in between
    assert not exp.tested("train", T0 + 3 * 3600 - 700, T0 + 3 * 3600 - 600,
                          T0 + 3 * 3600 - 570, W, 6)  # fmt: skip


def test_calm_windows_do_not_test_a_change_that_shows_under_burst() -> None:
    """The first burst after the change is its first test: calm hours before it are none."""
    exp = PoolExposure()
    _fill(exp, "serve", T0, T0 + 3600, 100.0)  # calm
    _fill(exp, "serve", T0 + 3600, T0 + 3900, 180.0)  # the burst the regression shows in
    assert not exp.tested("serve", T0 + 30, T0 + 3600, T0 + 3630, W, 6)
    # an earlier burst at that load after the change would have been a test
    _fill(exp, "serve", T0 + 1200, T0 + 1500, 185.0)
    assert exp.tested("serve", T0 + 30, T0 + 3600, T0 + 3630, W, 6)


def test_nothing_seen_is_no_test_and_old_minutes_are_forgotten() -> None:
    exp = PoolExposure(span_s=3600)
    assert not exp.tested("p", T0, T0 + 7200, T0 + 7230, W, 6)
    _fill(exp, "p", T0, T0 + 1800, math.nan)
    exp.prune(T0 + 1800 + 3600 + 120)
    assert not exp.tested("p", T0, T0 + 1800, T0 + 1830, W, 6)


def test_served_ratio_compares_the_minutes_since_the_onset_with_those_before() -> None:
    """A burst x1.8 from the onset: the minutes since over the grouping window before it.
    Calm on both sides reads 1; a training pool (no request rate) and an unknown pool 1."""
    exp = PoolExposure()
    _fill(exp, "serve", T0, T0 + 600, 100.0)
    _fill(exp, "serve", T0 + 600, T0 + 900, 180.0)
    assert math.isclose(exp.served_ratio("serve", T0 + 600, T0 + 840, 300.0), 1.8)
    assert math.isclose(exp.served_ratio("serve", T0 + 300, T0 + 540, 300.0), 1.0)
    _fill(exp, "train", T0, T0 + 900, math.nan)
    assert exp.served_ratio("train", T0 + 600, T0 + 840, 300.0) == 1.0
    assert exp.served_ratio("other", T0 + 600, T0 + 840, 300.0) == 1.0


def test_a_rate_drifting_up_a_fraction_of_a_percent_still_ran_at_the_onsets_load() -> None:
    """A pool whose rate creeps up 0.2 % over three hours ran at its onset's load all
    along (within the request rate's reporting floor): a change three hours before the
    onset was tested. Calm at 0.9 of a burst's peak is still no test of the burst."""
    exp = PoolExposure()
    t = T0
    while t < T0 + 3 * 3600:
        exp.observe("train", t, 1.347 + 0.003 * (t - T0) / (3 * 3600))
        t += W
    assert exp.tested("train", T0 + 60, T0 + 3 * 3600 - 600, T0 + 3 * 3600 - 570, W, 6)
    _fill(exp, "serve", T0, T0 + 3600, 100.0)
    _fill(exp, "serve", T0 + 3600, T0 + 3900, 111.0)
    assert not exp.tested("serve", T0 + 30, T0 + 3600, T0 + 3630, W, 6)
