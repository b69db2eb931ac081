"""A change the pool already ran at the onset's load without regressing is not the cause."""

from __future__ import annotations

import math

import pytest

from monitor.core.exposure import EFFICIENCY, PoolExposure
from monitor.core.lifecycle import _NORMALISED
from monitor.indicators import LAYER_METRICS

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


def test_earlier_level_is_the_median_of_minutes_at_this_load_before_the_cut() -> None:
    """Each minute keeps the efficiency of its peak-load window; only whole minutes before
    the cut, at this load (from the rate's floor below to `band` times above), count, and
    at least two of them; pruning forgets them."""
    exp = PoolExposure(span_s=3600)
    key = ("serve", "m", "mlp")
    for k in range(30):  # calm minutes at 100/s, MFU 0.6; a burst at 180/s, MFU 0.5
        t = T0 + 60.0 * k
        exp.observe_levels(key, t, 100.0, (0.6, 0.2, 50.0, 0.5))
        if 10 <= k < 14:
            exp.observe_levels(key, t + 30.0, 180.0 + k, (0.5 - 0.01 * (k - 10), 0.3, 40.0, 0.4))
    exp.observe_levels(key, T0, math.nan, (0.1, 0.1, 0.1, 0.1))  # no rate: not kept
    assert exp.earlier_level(key, "mfu", 185.0, T0 + 1800.0, 1.25) == pytest.approx(0.485)
    # the cut leaves two of the burst's minutes: still a comparison; one is not
    assert exp.earlier_level(key, "mfu", 185.0, T0 + 60.0 * 13, 1.25) == pytest.approx(0.495)
    assert exp.earlier_level(key, "mfu", 185.0, T0 + 60.0 * 12, 1.25) is None
    # a load far below or above this one is another load
    assert exp.earlier_level(key, "mfu", 140.0, T0 + 1800.0, 1.25) is None
    assert exp.earlier_level(key, "mfu", 300.0, T0 + 1800.0, 1.25) is None
    assert exp.earlier_level(key, "stall_frac", 185.0, T0 + 1800.0, 1.25) == pytest.approx(0.3)
    exp.prune(T0 + 1800.0 + 3600.0)
    assert exp.earlier_level(key, "mfu", 185.0, T0 + 7200.0, 1.25) is None


def test_the_levels_kept_are_the_load_normalised_efficiency_columns() -> None:
    """What a burst is compared on is what the load model normalises per layer."""
    assert set(EFFICIENCY) == _NORMALISED
    assert set(EFFICIENCY) <= set(LAYER_METRICS)


def test_the_offered_load_around_an_onset_is_read_window_by_window() -> None:
    """A burst that began two windows before an onset, right after an earlier burst ended:
    its minute's peak is no higher than the earlier burst's, window by window it is x1.8
    the calm before (the median of the onset's window and the two after, over the
    grouping window before the cause's lead). Partitions each report their share; a
    window is their median."""
    exp = PoolExposure()
    _fill(exp, "serve", T0, T0 + 60, 44.0)  # the earlier burst
    _fill(exp, "serve", T0 + 60, T0 + 240, 29.0)  # calm
    for part_rate in (52.0, 53.0, 54.0):
        _fill(exp, "serve", T0 + 240, T0 + 330, part_rate)  # the next burst
    onset = T0 + 260
    ratio = exp.offered_ratio("serve", onset, 6 * W, 2 * W, 300.0)
    assert ratio == pytest.approx(53.0 / 29.0, rel=0.01)
    # dated a window before the burst began (its window's edge): still the burst's load
    ratio = exp.offered_ratio("serve", T0 + 230, 6 * W, 2 * W, 300.0)
    assert ratio == pytest.approx(53.0 / 29.0, rel=0.01)
    # two windows before it: the calm
    assert exp.offered_ratio("serve", T0 + 210, 6 * W, 2 * W, 300.0) == pytest.approx(1.0)
    # no request rate (training), or nothing before the onset: unknown
    _fill(exp, "train", T0, T0 + 330, math.nan)
    assert math.isnan(exp.offered_ratio("train", onset, 6 * W, 2 * W, 300.0))
    assert math.isnan(exp.offered_ratio("serve", T0 + 10, 6 * W, 2 * W, 300.0))
    # windows older than the span kept one by one are forgotten
    exp.prune(T0 + 3 * 3600)
    assert math.isnan(exp.offered_ratio("serve", onset, 6 * W, 2 * W, 300.0))


def _minutes(exp: PoolExposure, start: float, minutes: int, load: float, wait: float) -> None:
    """`minutes` whole minutes of a (serve, m) aggregate from `start`: a window every 10 s
    at `load` per device with `wait` ms of queue (the other backlog columns follow it)."""
    for k in range(6 * minutes):
        levels = (wait, wait / 100.0, 2 * wait, 3 * wait, 4 * wait, 0.0)
        exp.observe_backlog(("serve", "m"), start + 10.0 * k, load, levels)


def test_a_queue_is_bounded_by_the_nearest_higher_load_the_pool_ran_at() -> None:
    """Calm at 100 per device (10 ms), bursts at 180 (60 ms) and 250 (150 ms), a lone
    minute at 140 (one minute is a burst's ragged edge, not a level). At 130 the nearest
    higher load with two minutes or more is 180: its queue bounds this load's; at 200 it
    is 250; above every earlier load there is no bound. Minutes from `before_ts` on do not
    count; the minutes since an onset read back at their peak load."""
    exp = PoolExposure()
    t = T0 - T0 % 60
    _minutes(exp, t, 10, 100.0, 10.0)
    _minutes(exp, t + 600, 3, 180.0, 60.0)
    _minutes(exp, t + 780, 10, 100.0, 10.0)
    _minutes(exp, t + 1380, 1, 140.0, 5.0)
    _minutes(exp, t + 1440, 4, 250.0, 150.0)
    _minutes(exp, t + 1680, 10, 100.0, 10.0)
    before = t + 2280
    assert exp.backlog_bound(("serve", "m"), "queue_wait_ms", 130.0, before) == 60.0
    assert exp.backlog_bound(("serve", "m"), "lat_p99_ms", 130.0, before) == 240.0
    assert exp.backlog_bound(("serve", "m"), "queue_wait_ms", 200.0, before) == 150.0
    # within the rate's floor below an earlier load is that load
    assert exp.backlog_bound(("serve", "m"), "queue_wait_ms", 255.0, before) == 150.0
    assert exp.backlog_bound(("serve", "m"), "queue_wait_ms", 300.0, before) is None
    assert exp.backlog_bound(("serve", "m"), "queue_wait_ms", 200.0, t + 1440) is None
    assert exp.backlog_bound(("other", "m"), "queue_wait_ms", 130.0, before) is None
    _minutes(exp, before, 3, 130.0, 25.0)
    assert exp.backlog_since(("serve", "m"), "queue_wait_ms", before, before + 170) == 25.0
    assert exp.backlog_since(("serve", "m"), "queue_wait_ms", before + 600, before + 700) is None
    # a training pool reports no request rate: nothing kept
    exp.observe_backlog(("train", "m"), before, math.nan, (1.0,) * 6)
    assert exp.backlog_since(("train", "m"), "queue_wait_ms", before, before + 60) is None
    exp.prune(before + 7 * 3600)
    assert exp.backlog_since(("serve", "m"), "queue_wait_ms", before, before + 170) is None
