"""A load-normalised stream's step back from an excursion is told from a regression."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core.excursions import Excursions

CALM, BURST = (240.0, 22_000.0), (397.0, 36_600.0)


def step(
    ex: Excursions, before: float, after: float, load: tuple[float, float], onset: float,
    *, sign: float = 1.0, row: int = 3, col: int = 1, kind: str = "layer",
) -> float:  # fmt: skip
    """One detection through `returns`: the excursion's onset, NaN when no return."""
    out = ex.returns(
        kind, np.array([row]), np.array([col]), np.array([before]), np.array([after]),
        np.array([sign]), np.array([load]), np.array([onset]), np.array([0.05]), 0.05,
    )  # fmt: skip
    return float(out[0])


def test_a_step_back_to_the_level_left_at_another_load_is_a_return() -> None:
    """Stall share (bad up): 1.03 -> 0.56 as a burst begins, then back to 1.07 at calm:
    within 5 % of the level left, found at another load, so a return dated from the
    excursion's onset; the entry is used up by it."""
    ex = Excursions()
    assert np.isnan(step(ex, 1.03, 0.56, BURST, 100.0))
    assert step(ex, 0.56, 1.07, CALM, 340.0) == 100.0
    assert len(ex) == 0
    assert np.isnan(step(ex, 0.56, 1.07, CALM, 500.0))


def test_no_return_at_the_same_load_past_the_level_or_without_a_step_away() -> None:
    """At the load of the step away (a fix undone at steady load) it is a regression; so
    is a step well past the level left, and a step with no step the good way before it."""
    same = Excursions()
    step(same, 1.03, 0.80, CALM, 100.0)
    assert np.isnan(step(same, 0.80, 1.03, (245.0, 22_300.0), 340.0))
    past = Excursions()
    step(past, 1.03, 0.56, BURST, 100.0)
    assert np.isnan(step(past, 0.56, 1.20, CALM, 340.0))
    assert np.isnan(step(Excursions(), 0.56, 1.03, CALM, 340.0))


def test_the_first_step_away_is_kept_and_direction_follows_the_metric() -> None:
    """Two steps the good way: the level left is the first one's. For a metric where down
    is bad (MFU) the step away is up; a metric with no bad direction is never a return."""
    ex = Excursions()
    step(ex, 1.00, 0.80, BURST, 100.0)
    step(ex, 0.80, 0.60, BURST, 160.0)
    assert step(ex, 0.60, 0.98, CALM, 340.0) == 100.0
    mfu = Excursions()
    step(mfu, 1.00, 1.20, BURST, 100.0, sign=-1.0)
    assert step(mfu, 1.20, 1.01, CALM, 340.0, sign=-1.0) == 100.0
    none = Excursions()
    step(none, 1.0, 0.5, BURST, 100.0, sign=0.0)
    assert np.isnan(step(none, 0.5, 1.0, CALM, 340.0, sign=0.0))
    assert len(none) == 0


def test_the_next_bursts_rise_is_no_return() -> None:
    """A queue the model under-predicts at bursts: its ratio falls 1.5 -> 1.0 as a burst
    ends (the good way, found at calm load) and rises 1.0 -> 1.5 at the next burst, back to
    the level it left, at another load. That rise moves away from the expectation: it is
    the burst, judged as one (against earlier bursts), not a return."""
    ex = Excursions()
    step(ex, 1.5, 1.0, CALM, 100.0)
    assert np.isnan(step(ex, 1.0, 1.5, BURST, 4000.0))


def test_released_rows_are_forgotten_and_entries_survive_a_checkpoint() -> None:
    """`forget` drops a released row's entry (its id may be reused by another stream);
    `snapshot`/`restore` carries the rest."""
    ex = Excursions()
    step(ex, 1.03, 0.56, BURST, 100.0, row=3)
    step(ex, 1.03, 0.56, BURST, 100.0, row=4)
    step(ex, 1.03, 0.56, BURST, 100.0, row=3, kind="pool_layer")
    ex.forget("layer", np.array([3]))
    back = Excursions.restore(ex.snapshot())
    assert len(back) == 2
    assert np.isnan(step(back, 0.56, 1.05, CALM, 340.0, row=3))
    assert step(back, 0.56, 1.05, CALM, 340.0, row=4) == 100.0
    assert step(back, 0.56, 1.05, CALM, 340.0, row=3, kind="pool_layer") == 100.0


@settings(max_examples=200, deadline=None)
@given(
    levels=st.lists(
        st.sampled_from([0.5, 1.0, 1.02, 1.04, 1.06, 2.0]) | st.floats(0.05, 5.0),
        min_size=2,
        max_size=12,
    ),
    loads=st.lists(st.sampled_from([CALM, BURST, (300.0, 27_000.0)]), min_size=12, max_size=12),
)
def test_only_a_bad_way_step_back_near_the_level_left_at_another_load_is_a_return(
    levels: list[float], loads: list[tuple[float, float]]
) -> None:
    """Over any walk of levels: a return is a step the bad way (up, here), landing within
    the floor of the level the stream left at its first step the good way since its last
    step the bad way, nearer 1 than it started, at a batch or rate more than 5 % from that
    step's."""
    ex = Excursions()
    left: tuple[float, tuple[float, float]] | None = None
    for k, (a, b) in enumerate(itertools.pairwise(levels)):
        got = step(ex, a, b, loads[k], 10.0 * k)
        if b <= a:
            assert np.isnan(got)
            if b < a:
                left = left or (a, loads[k])
            continue
        if left is None:
            assert np.isnan(got)
        else:
            pairs = zip(left[1], loads[k], strict=True)
            moved = any(abs(np.log(x / y)) > np.log1p(0.05) for x, y in pairs)
            nearer = abs(b - 1.0) < abs(a - 1.0)
            want = abs(b - left[0]) < 0.05 * left[0] and nearer and moved
            assert (not np.isnan(got)) == want
        left = None
