"""The simple CUSUM kind: correct, vectorised, and checkpointable."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.detect.cusum import Cusum


def _feed(det: Cusum, x: np.ndarray, t0: float = 0.0):
    """x: (T, n_rows, K); returns list of (t, Detections)."""
    out = []
    rows = np.arange(x.shape[1], dtype=np.int64)
    for t in range(x.shape[0]):
        d = det.update(rows, np.full(x.shape[1], t0 + 10.0 * t), x[t])
        if len(d):
            out.append((t, d))
    return out


def test_step_down_detected_with_onset_and_levels() -> None:
    """A 15% drop is found within 4 windows; onset is the last healthy window's end."""
    rng = np.random.default_rng(0)
    x = 0.5 * (1 + 0.01 * rng.standard_normal((120, 4, 1)))
    x[60:, 1, 0] *= 0.85
    hits = _feed(Cusum(1, burn_in=20), x)
    assert len(hits) == 1
    t, d = hits[0]
    assert d.rows.tolist() == [1]
    assert 60 <= t <= 63
    assert abs(d.onset_ts[0] - 10.0 * 59) <= 10.0  # end of the last healthy window, ±1
    assert abs(d.before[0] - 0.5) < 0.01
    assert abs(d.after[0] - 0.425) < 0.02  # mean since the estimated onset
    assert d.score[0] >= 1.0


def test_step_up_detected_too() -> None:
    """Two-sided: a rise in stall fraction is detected as well."""
    x = np.full((80, 2, 1), 0.30)
    x[:, :, 0] += 0.003 * np.sin(np.arange(80))[:, None]
    x[40:, 0, 0] = 0.40
    hits = _feed(Cusum(1, burn_in=20), x)
    assert [(h[1].rows.tolist(), h[1].after[0] > h[1].before[0]) for h in hits] == [([0], True)]


def test_nan_cells_leave_state_untouched() -> None:
    """Missing windows (NaN) neither advance burn-in nor trigger anything."""
    det = Cusum(2, burn_in=5)
    rows = np.array([0], dtype=np.int64)
    for t in range(10):
        det.update(rows, np.array([10.0 * t]), np.array([[1.0, np.nan]]))
    assert det._arrays["n"][0].tolist() == [5, 0]


def test_one_window_outlier_is_not_a_change() -> None:
    """Clipping keeps a single huge outlier from alarming on its own."""
    x = np.full((60, 1, 1), 0.5) + 0.005 * np.cos(np.arange(60))[:, None, None]
    x[40, 0, 0] = 50.0
    assert _feed(Cusum(1, burn_in=20, h=8.0, clip=4.0), x) == []


def test_capacity_grows_and_forget_resets() -> None:
    """Rows beyond capacity allocate on demand; forgotten rows restart burn-in."""
    det = Cusum(1, capacity=2)
    det.update(np.array([7], dtype=np.int64), np.array([1.0]), np.array([[1.0]]))
    assert det.capacity >= 8
    det.forget(np.array([7], dtype=np.int64))
    assert det._arrays["n"][7, 0] == 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), cut=st.integers(25, 70))
def test_snapshot_restore_gives_identical_future(seed: int, cut: int) -> None:
    """Checkpoint at any point; the restored detector emits exactly the same detections."""
    rng = np.random.default_rng(seed)
    x = 1 + 0.05 * rng.standard_t(3, size=(100, 6, 3))
    x[50:, :3, :] *= 0.7
    a = Cusum(3, burn_in=10)
    rows = np.arange(6, dtype=np.int64)
    for t in range(cut):
        a.update(rows, np.full(6, 10.0 * t), x[t])
    b = Cusum.restore(a.snapshot())
    assert b.snapshot() == a.snapshot()
    for t in range(cut, 100):
        da = a.update(rows, np.full(6, 10.0 * t), x[t])
        db = b.update(rows, np.full(6, 10.0 * t), x[t])
        for f in ("rows", "cols", "detected_ts", "onset_ts", "before", "after", "score"):
            assert np.array_equal(getattr(da, f), getattr(db, f))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_vectorised_equals_one_row_at_a_time(seed: int) -> None:
    """Updating 5 rows together gives the same detections as 5 separate detectors."""
    rng = np.random.default_rng(seed)
    x = 1 + 0.03 * rng.standard_normal((80, 5, 1))
    x[40:, ::2, 0] *= 1.2
    together = _feed(Cusum(1, burn_in=10), x)
    got = sorted((t, int(r)) for t, d in together for r in d.rows)
    alone = sorted(
        (t, i) for i in range(5) for t, _ in _feed(Cusum(1, burn_in=10), x[:, i : i + 1, :])
    )
    assert got == alone
