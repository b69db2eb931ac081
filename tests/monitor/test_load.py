"""Load normalisation: ratios to the load model's expectation, withheld where it extrapolates."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.detect.load_model import LoadModel
from monitor.load import LoadAdjuster


def mfu(batch: np.ndarray) -> np.ndarray:
    """Roofline-shaped MFU: memory-bound at small batch, flattening as it turns compute-bound."""
    return batch / (np.maximum(batch, 60.0 + 0.45 * batch) + 8.0)


def window(
    rng: np.random.Generator, mean_batch: float, n: int = 64
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One window of a pool: group ids, (batch, rate) per device, and each device's MFU."""
    batch = mean_batch * np.exp(0.1 * rng.standard_normal(n))
    load = np.c_[batch, batch / 12.5]
    y = mfu(batch) * np.exp(0.02 * rng.standard_normal(n))
    return np.zeros(n, dtype=np.int64), load, y[:, None]


def test_support_counts_windows_of_data_near_the_load_and_drops_at_a_new_one() -> None:
    """Steady load: support grows towards the memory (1 / (1 - forget)); a new load: ~1."""
    rng = np.random.default_rng(0)
    model = LoadModel(1, forget=0.98)
    g = np.zeros(50, dtype=np.int64)
    for _ in range(300):
        model.update(g, 10.0 + rng.standard_normal((50, 1)), rng.standard_normal(50))
    steady = model.support(g, 10.0 + rng.standard_normal((50, 1)))
    far = model.support(g, 30.0 + rng.standard_normal((50, 1)))
    assert 20.0 < float(steady[0]) <= 60.0  # memory 50 windows
    assert float(far[0]) < 1.0
    assert np.all(steady == steady[0])  # one value per group and call
    model.update(g, 30.0 + rng.standard_normal((50, 1)), rng.standard_normal(50))
    again = model.support(g, 30.0 + rng.standard_normal((50, 1)))
    assert 0.5 < float(again[0]) < 3.0  # one window at the new load is about one window


def test_first_windows_of_an_unseen_burst_are_withheld_then_judged() -> None:
    """A pool's first burst: withheld (NaN) while the model extrapolates, and counted;
    judged again once the model has seen min_support windows there."""
    rng = np.random.default_rng(1)
    adj = LoadAdjuster(("mfu",), min_support=5.0)
    base = LoadAdjuster(("mfu",))
    for _ in range(200):
        args = window(rng, 80.0)
        adj.adjust(*args)
        base.adjust(*args)
    before = adj.extrapolated  # the model's first windows, before it had 5 windows of data
    assert 0 < before <= 6 * 64
    ratios_at_burst = []
    for i in range(12):
        args = window(rng, 134.0)
        r, expected = adj.adjust(*args)
        r0, _ = base.adjust(*args)
        ratios_at_burst.append((r, r0))
        if i == 0:
            assert np.isnan(r).all()
            assert np.isnan(expected).all()
            # Without the guard the first burst window is judged on an extrapolation.
            assert np.isfinite(r0).all()
    withheld = [int(np.isnan(r).all()) for r, _ in ratios_at_burst]
    assert 1 <= sum(withheld) <= 8
    assert withheld == sorted(withheld, reverse=True)  # a prefix of the burst, then judged
    assert adj.extrapolated - before == sum(withheld) * 64
    judged = ratios_at_burst[-1][0]
    assert abs(float(np.nanmean(judged)) - 1.0) < 0.02
    # Back at the usual load the model has plenty of data: nothing is withheld.
    r, _ = adj.adjust(*window(rng, 80.0))
    assert np.isfinite(r).all()


def test_withholding_is_off_at_zero_and_columns_not_load_driven_pass_through() -> None:
    """min_support=0 never withholds; a column outside LOAD_SENSITIVE is returned as is."""
    rng = np.random.default_rng(2)
    adj = LoadAdjuster(("mfu", "temp_c"), min_support=0.0)
    for _ in range(50):
        g, load, y = window(rng, 80.0)
        adj.adjust(g, load, np.c_[y, np.full(y.shape, 61.0)])
    g, load, y = window(rng, 300.0)
    r, _ = adj.adjust(g, load, np.c_[y, np.full(y.shape, 61.0)])
    assert np.isfinite(r[:, 0]).all()
    assert adj.extrapolated == 0
    assert np.all(r[:, 1] == 61.0)


@pytest.mark.parametrize("n_features", [1, 3])
def test_support_of_an_untrained_group_is_tiny_not_an_error(n_features: int) -> None:
    """A group never learned from has no information: support ~0, no LinAlgError."""
    model = LoadModel(n_features)
    s = model.support(np.array([3, 3]), np.ones((2, n_features)))
    assert s.shape == (2,)
    assert np.all(s < 1e-3)


def test_a_frozen_group_is_not_withheld_at_a_new_load() -> None:
    """While a group is held (its incident pages) it cannot learn a new load, so the guard
    does not withhold it (it would never end); it thaws back under the guard."""
    rng = np.random.default_rng(3)
    adj = LoadAdjuster(("mfu",), min_support=5.0)
    for _ in range(100):
        adj.adjust(*window(rng, 80.0))
    g = np.zeros(1, dtype=np.int64)
    adj.hold(g, hold=True)
    for _ in range(10):
        r, _ = adj.adjust(*window(rng, 134.0))
        assert np.isfinite(r).all()
    adj.hold(g, hold=False)
    r, _ = adj.adjust(*window(rng, 200.0))
    assert np.isnan(r).all()
