"""Load-aware expectations: per-group RLS, honest residuals, and guards against learning a
regression away."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core.load_model import LoadModel
from monitor.detect.bank import BankCusum


def mfu(batch: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """A load-dependent MFU: bigger batches run hotter, queueing at high rate costs a bit."""
    return 0.30 + 0.004 * batch - 0.0002 * rate


def traffic(rng: np.random.Generator, n: int, burst: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Batch sizes and request rates; a burst doubles the rate and pins big batches."""
    batch = rng.choice([8.0, 16.0, 32.0], n)
    rate = rng.uniform(100, 300, n)
    if burst:
        batch = np.full(n, 48.0)
        rate = rate * 2.5
    return batch, rate


def test_learns_per_group_coefficients_with_repeated_groups_in_a_call() -> None:
    """Many samples of one group in one call, many groups: each group gets its own fit."""
    rng = np.random.default_rng(0)
    truth = np.array([[0.5, 0.01, -0.001], [0.2, 0.002, 0.0005], [0.8, -0.004, 0.0]])
    model = LoadModel(2)
    for _ in range(60):
        g = rng.integers(0, 3, 300)
        x = np.c_[rng.uniform(1, 64, 300), rng.uniform(10, 500, 300)]
        y = (truth[g] * np.c_[np.ones(300), x]).sum(1) + 0.001 * rng.standard_normal(300)
        model.update(g, x, y)
    np.testing.assert_allclose(model.coef(np.arange(3)), truth, atol=2e-3, rtol=0.05)


def test_prediction_is_made_before_learning_and_nan_while_warming_up() -> None:
    """The returned expectation never saw its own sample; warm-up groups predict NaN."""
    model = LoadModel(1, warmup=3)
    x = np.array([[1.0], [2.0], [3.0]])
    first = model.update(np.zeros(3, dtype=np.int64), x, np.array([1.0, 2.0, 3.0]))
    assert np.isnan(first).all()
    before = model.predict(np.array([0]), np.array([[10.0]]))
    second = model.update(np.array([0]), np.array([[10.0]]), np.array([1000.0]))
    assert second[0] == before[0]
    assert abs(second[0] - 10.0) < 0.1  # y = x was learned from the first call only


def test_a_traffic_burst_is_not_a_regression_but_a_burst_only_regression_is() -> None:
    """Residuals stay flat through a burst; a slowdown that only appears under burst load
    leaves a residual the detector catches."""
    rng = np.random.default_rng(1)
    model, det = LoadModel(2), BankCusum(1)
    n_dev = 32
    alarms: list[tuple[int, float]] = []
    burst_resid: list[float] = []
    for t in range(700):
        in_burst = 300 <= t < 340 or 600 <= t < 640
        batch, rate = traffic(rng, n_dev, burst=in_burst)
        y = mfu(batch, rate) * (1 + 0.01 * rng.standard_normal(n_dev))
        if t >= 600:
            y = np.where(batch > 40, y * 0.85, y)  # regression under burst load only
        g = np.zeros(n_dev, dtype=np.int64)
        expected = model.update(g, np.c_[batch, rate], y)
        resid = y - expected
        if 300 <= t < 340:
            burst_resid.append(float(np.nanmean(resid)))
        # Detect on y / expected: ~1.0 whatever the load, so the effect-size gate reads
        # as "relative to what this load should give".
        det_in = (y / expected)[:, None]
        hits = det.update(np.arange(n_dev), np.full(n_dev, 10.0 * t), det_in)
        alarms.extend(
            (int(r), float(ts)) for r, ts in zip(hits.rows, hits.detected_ts, strict=True)
        )
        if len(hits):
            model.freeze(np.array([0]))  # stop learning while the group alarms
    assert abs(np.mean(burst_resid)) < 0.01  # the first burst is explained by load
    assert not [a for a in alarms if a[1] < 6000.0]  # ... so nothing fired before the regression
    caught = {r for r, ts in alarms if 6000.0 <= ts <= 6400.0}
    assert len(caught) >= 0.9 * n_dev


def test_a_fresh_step_is_learned_only_slowly() -> None:
    """Clipped learning: after 20 calls of a 10-sigma step, the expectation moved < 40%."""
    rng = np.random.default_rng(2)
    model = LoadModel(1)
    g = np.zeros(16, dtype=np.int64)
    for _ in range(300):
        x = rng.uniform(1, 10, (16, 1))
        model.update(g, x, 1.0 + 0.1 * x[:, 0] + 0.01 * rng.standard_normal(16))
    for _ in range(20):
        x = rng.uniform(1, 10, (16, 1))
        exp = model.update(g, x, 1.1 + 0.1 * x[:, 0] + 0.01 * rng.standard_normal(16))
    moved = float(np.mean(exp - (1.0 + 0.1 * x[:, 0])))
    assert moved < 0.04


def test_freeze_thaw_and_zero_weights_stop_learning() -> None:
    """Frozen groups and zero-weight samples are predicted but not learned from."""
    rng = np.random.default_rng(3)
    model = LoadModel(1, warmup=2)
    x = rng.uniform(0, 1, (50, 1))
    model.update(np.zeros(50, dtype=np.int64), x, 2 * x[:, 0])
    model.update(np.ones(50, dtype=np.int64), x, 2 * x[:, 0])
    frozen_coef = model.coef(np.array([0, 1]))
    model.freeze(np.array([0]))
    model.update(np.zeros(50, dtype=np.int64), x, 5 * x[:, 0])
    model.update(np.ones(50, dtype=np.int64), x, 5 * x[:, 0], weight=np.zeros(50))
    np.testing.assert_array_equal(model.coef(np.array([0, 1])), frozen_coef)
    model.thaw(np.array([0]))
    model.update(np.zeros(50, dtype=np.int64), x, 5 * x[:, 0])
    assert not np.array_equal(model.coef(np.array([0])), frozen_coef[:1])


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cut=st.integers(1, 59))
def test_snapshot_restore_gives_identical_future_outputs(seed: int, cut: int) -> None:
    """Checkpoint anywhere, restore, continue: bit-identical expectations and bytes."""
    rng = np.random.default_rng(seed)
    calls = []
    for _ in range(60):
        g = rng.integers(0, 40, 64)  # groups past the initial capacity: growth
        x = rng.uniform(0, 100, (64, 2))
        y = 0.4 + 0.001 * x[:, 0] + 0.01 * rng.standard_normal(64)
        y[rng.random(64) < 0.05] = np.nan
        calls.append((g, x, y))
    model = LoadModel(2, capacity=2)
    for c in calls[:cut]:
        model.update(*c)
    twin = LoadModel.restore(model.snapshot())
    assert twin.snapshot() == model.snapshot()
    for c in calls[cut:]:
        np.testing.assert_array_equal(model.update(*c), twin.update(*c))
    assert twin.snapshot() == model.snapshot()


def test_learn_grid_is_support_then_update_bit_for_bit() -> None:
    """A complete grid learned at once gives the per-sample path's numbers and state, byte
    for byte (what the golden replay relies on), whatever the groups' sizes and order."""
    rng = np.random.default_rng(5)
    for groups_n, rows, stride in ((1, 40, 3), (7, 300, 5), (40, 9000, 7)):
        grid, flat = LoadModel(3, capacity=stride), LoadModel(3, capacity=stride)
        for _ in range(6):
            g = rng.integers(0, groups_n, rows)
            f = np.c_[np.log1p(rng.uniform(1, 64, (rows, 2))), rng.uniform(0, 1, rows)]
            y = rng.uniform(0.1, 0.9, (rows, stride)) * rng.choice([1.0, 1e3])
            assert grid.complete(g, stride, f, y)
            sup, exp = grid.learn_grid(g, stride, f, y, support=True)
            slot, row = np.nonzero(np.ones((stride, rows), dtype=bool))  # column-major
            ids = g[row] * stride + slot
            flat.reserve((int(g.max()) + 1) * stride)
            want_sup = flat.support(ids, f[row])
            want_exp = flat.update(ids, f[row], y[row, slot])
            assert sup is not None
            assert np.array_equal(sup[row, slot], want_sup)
            assert np.array_equal(exp[row, slot], want_exp, equal_nan=True)
            assert grid.snapshot() == flat.snapshot()


def test_a_grid_with_a_gap_or_a_frozen_group_is_not_complete() -> None:
    """`learn_grid` only takes grids whose every sample is learned from."""
    model = LoadModel(1, capacity=8)
    g, f, y = np.array([0, 1]), np.ones((2, 1)), np.ones((2, 2))
    assert model.complete(g, 2, f, y)
    assert not model.complete(g, 2, f, np.array([[1.0, np.nan], [1.0, 1.0]]))
    model.freeze(np.array([3]))  # group 1's second column
    assert not model.complete(g, 2, f, y)


def test_a_feature_spread_within_its_reporting_floor_teaches_no_slope() -> None:
    """Eight devices whose request rates differ by up to 2 %, persistently, and whose levels
    differ by up to 30 % for reasons of their own. Learnt as load, the rate reads as a steep
    response: a 1 % rate change moves the expectation by about 8 %. With the rate known
    only to its 5 % floor it moves it by under 1 %, while a x2 burst that raises the level
    x1.5 is still learnt as the response it is."""
    floor = math.log1p(0.05)
    rates = 100.0 * (1.0 + 0.02 * np.arange(8) / 7)
    levels = 50.0 * (1.0 + 0.3 * np.arange(8) / 7)
    groups = np.zeros(8, dtype=np.int64)

    def feats(rate: np.ndarray) -> np.ndarray:
        batch = np.full(rate.size, 32.0)
        return np.column_stack([np.log1p(batch), np.log1p(rate), 1.0 / batch])

    def moved_by_one_percent(jitter: tuple[float, ...], burst: bool) -> tuple[float, float]:
        m = LoadModel(3, forget=0.99, jitter=jitter)
        for t in range(300):
            on = burst and t % 20 < 10
            m.update(groups, feats(rates * (2.0 if on else 1.0)), levels * (1.5 if on else 1.0))
        base, up = (
            m.predict(groups[:1], feats(rates[:1])),
            m.predict(groups[:1], feats(rates[:1] * 1.01)),
        )
        at_burst = m.predict(groups[:1], feats(rates[:1] * 2.0))
        return float(up[0] / base[0] - 1.0), float(at_burst[0] / base[0])

    steep, _ = moved_by_one_percent((), burst=False)
    flat, _ = moved_by_one_percent((0.0, floor, 0.0), burst=False)
    assert steep > 0.05
    assert abs(flat) < 0.01
    _, burst_ratio = moved_by_one_percent((0.0, floor, 0.0), burst=True)
    assert 1.4 < burst_ratio < 1.6
