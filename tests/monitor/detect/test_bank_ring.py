"""The half-precision value ring: what it holds, how exactly, and old checkpoints."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.detect import _blob, bank_ring, bank_state
from monitor.detect.bank import BankCusum
from monitor.detect.base import Detections

WINDOW = 10.0
_F32_MAX = float(np.finfo(np.float32).max)
_finite32 = st.floats(-1e30, 1e30).map(lambda v: float(np.float32(v)))


def feed(det: BankCusum, x: np.ndarray, t0: float = 0.0) -> Detections:
    """x: (T, n_rows, 1), one dense wave per step; all detections in order."""
    rows = np.arange(x.shape[1], dtype=np.int64)
    return Detections.concat(
        [det.update(rows, np.full(rows.size, t0 + WINDOW * t), x[t]) for t in range(x.shape[0])]
    )


@settings(max_examples=300, deadline=None)
@given(
    anchor=_finite32,
    scale=st.floats(0.0, 1e30),
    spread=st.floats(0.0, 1e30),
    frac=st.floats(-1.0, 1.0),
)
def test_a_sample_within_reach_is_held_to_its_offsets_eleven_bits(
    anchor: float, scale: float, spread: float, frac: float
) -> None:
    """decode(encode(x)) is within 2^-11 of x's distance from the anchor, or 2^-25 units
    under float16's normal range; decoding and encoding again gives the same offsets."""
    a = np.array([anchor], dtype=np.float32)
    u = bank_ring.unit_holding(a.astype(np.float64), np.array([scale]), np.array([spread]))
    x = np.array([float(a[0]) + frac * spread])
    if not np.isfinite(x).all() or abs(x[0]) > _F32_MAX:
        return
    q = bank_ring.encode(x, a, u)
    back = bank_ring.decode(q, a, u)
    err = abs(float(back[0] - x[0]))
    assert err <= 2.0**-11 * abs(float(x[0] - a[0])) + 2.0**-25 * float(u[0])
    assert np.array_equal(bank_ring.encode(back, a, u), q, equal_nan=True)


def test_a_unit_is_a_power_of_two_at_or_above_the_magnitude() -> None:
    mags = np.array([0.3, 1.0, 1.5, 1e-9, 3e38, 0.0])
    u = bank_ring.unit_for(mags).astype(np.float64)
    assert (np.frexp(u)[0] == 0.5).all()  # powers of two
    assert (u[:4] >= mags[:4]).all()
    assert (u[:4] <= 2 * mags[:4]).all()
    assert u[4] == 2.0**127  # float32's largest: offsets of float32 samples still fit
    assert u[5] < 1e-29  # no magnitude: the smallest unit, so the next sample refits


def test_a_metric_at_exactly_zero_keeps_its_zeros_when_it_jumps() -> None:
    """Fallback fraction 0 for 60 windows, then 0.4: until the alarm the zeros still read
    0 (the unit widens about the anchor), and the jump reads 0.4 to 2^-11 of itself."""
    det = BankCusum(1)
    for t in range(62):
        x = np.array([[0.4 if t >= 60 else 0.0]])
        assert det.update(np.array([0]), np.array([WINDOW * t]), x).rows.size == 0
    vals = det._chrono_values(np.array([0]))[0]
    zeros = vals[:30][np.isfinite(vals[:30])]
    assert zeros.size >= 20
    assert (zeros == 0.0).all()
    assert np.allclose(vals[30:], 0.4, rtol=2.0**-11, atol=0.0)


def test_a_large_drop_is_relearnt_at_its_new_level() -> None:
    """A level of 100 with 1% noise drops 100-fold: the cell alarms once, and the level it
    re-learns is the new one to within the new noise. (The samples that arrive before the
    alarm are held only to 2^-11 of the drop, 0.05: the ring re-anchors at the alarm.)"""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        x = 100.0 * (1.0 + 0.01 * rng.standard_normal(500))
        x[400:] /= 100.0
        det = BankCusum(1)
        got = feed(det, x[:450, None, None])
        assert got.detected_ts.size == 1, seed
        assert 399 * WINDOW <= got.onset_ts[0] <= 401 * WINDOW
        assert abs(float(det._s["mu"][0]) - 1.0) < 0.01, seed


def _float32_ring_blob(det: BankCusum) -> bytes:
    """The detector's checkpoint as written while rings held float32 samples."""
    params, arrays = _blob.unpack(det.snapshot(), det.kind)
    ring = bank_ring.decode(arrays["ring"], arrays["ra"], arrays["rs"]).astype(np.float32)
    old = {name: arr for name, arr in arrays.items() if name not in ("ra", "rs")}
    old["ring"] = ring
    return _blob.pack(det.kind, params, old)


def test_a_checkpoint_with_a_float32_ring_restores_and_detects_alike() -> None:
    """Restored from a checkpoint written before the ring was halved, a detector holds
    the same samples to the ring's precision and then finds the same change points."""
    rng = np.random.default_rng(11)
    T, n = 700, 6
    x = 50.0 + rng.standard_normal((T, n))
    x[:, 0] = 0.0  # a metric at exactly zero
    x[450:, 1:4] += 4.0
    x[450:, 0] = 0.3
    cut = 300
    whole = BankCusum(1)
    want = feed(whole, x[:, :, None])
    first = BankCusum(1)
    feed(first, x[:cut, :, None])
    back = bank_state.restore(BankCusum, _float32_ring_blob(first))
    assert back._ring.dtype == np.float16
    cells = np.arange(n)
    held = first._chrono_values(cells)
    np.testing.assert_allclose(back._chrono_values(cells), held, rtol=2.0**-11, atol=1e-6)
    got = feed(back, x[cut:, :, None], t0=cut * WINDOW)
    mine = want.detected_ts >= cut * WINDOW
    assert got.rows.tolist() == want.rows[mine].tolist()
    assert got.detected_ts.tolist() == want.detected_ts[mine].tolist()
    assert set(got.rows.tolist()) >= {0, 1, 2, 3}


def test_scalars_the_parameters_leave_unread_are_never_written() -> None:
    """With the MA term and warm starts off, theta, the ARMA innovations, the family and
    the AR count are idle: burn-in, alarms, re-baselining, absent cells and forgotten
    streams never write them (so their pages are never backed), and checkpoints still
    hold them."""
    rng = np.random.default_rng(5)
    T, n, k = 400, 40, 3
    x = 10.0 + rng.standard_normal((T, n, k))
    x[200:, :10] += 5.0
    x[rng.random((T, n, k)) < 0.1] = np.nan
    det = BankCusum(k, capacity=n)
    assert bank_state.idle(det) == {"theta", "uprev", "ulprev", "fam", "na"}
    for name in bank_state.idle(det):
        det._s[name].flags.writeable = False
    got = feed(det, x)
    assert np.unique(got.rows[got.detected_ts >= 200 * WINDOW]).size >= 8
    det.forget(np.arange(5))
    feed(det, x[:50], t0=T * WINDOW)
    back = bank_state.restore(BankCusum, det.snapshot())
    assert set(_blob.unpack(det.snapshot(), det.kind)[1]) >= bank_state.idle(det)
    assert bank_state.idle(BankCusum(k, ma_max=0.5, warm_start=64)) == {"na"}
    assert back.state_bytes_per_cell() == det.state_bytes_per_cell()
