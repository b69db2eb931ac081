"""The bank's time ring held per stream (`bank_times`): what it holds, per cell, is bit for bit
a ring per cell, whatever metrics go missing, rows expire, the epoch moves or a checkpoint
comes back in between."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.detect import bank_state
from monitor.detect.bank import BankCusum
from monitor.detect.bank_times import EMPTY, FOLLOW

_DAY_12 = float(1 << 20)  # past this from the epoch, the epoch moves (`bank._T_SPAN`)


class CellRings:
    """A ring per cell, written as the bank writes a sample: the model the rings must match."""

    def __init__(self, hist: int) -> None:
        self.hist = hist
        self.t = np.full((hist, 0), np.nan, dtype=np.float32)
        self.t0 = np.nan

    def wave(self, det: BankCusum, rows: np.ndarray, ts: np.ndarray, x: np.ndarray) -> None:
        """One `det.update(rows, ts, x)`, mirrored: shift to the new epoch, then each present
        cell's time into the slot its ring position was at."""
        k = det.n_metrics
        pos = bank_state.state_arrays(det)["pos"].copy() if det._rows else np.zeros(0)
        det.update(rows, ts, x)
        need = det._rows * k
        if self.t.shape[1] < need:
            grown = np.full((self.hist, need), np.nan, dtype=np.float32)
            grown[:, : self.t.shape[1]] = self.t
            self.t = grown
        if np.isfinite(self.t0) and det._t0 != self.t0:
            self.t[...] = self.t.astype(np.float64) - (det._t0 - self.t0)
        self.t0 = det._t0
        pos = np.concatenate([pos, np.zeros(need - pos.size, dtype=pos.dtype)]).astype(np.int64)
        for i, r in enumerate(rows.tolist()):
            for j in range(k):
                if np.isfinite(x[i, j]):
                    c = r * k + j
                    self.t[pos[c], c] = np.float32(ts[i] - self.t0)

    def forget(self, det: BankCusum, rows: np.ndarray) -> None:
        det.forget(rows)
        for r in rows.tolist():
            self.t[:, r * det.n_metrics : (r + 1) * det.n_metrics] = np.nan


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool((a.view(np.uint32) == b.view(np.uint32)).all())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from([1, 3, 8]), n_rows=st.integers(1, 9))
def test_per_cell_times_match_a_ring_per_cell(seed: int, k: int, n_rows: int) -> None:
    """Lockstep waves, then waves with rows in any order, metrics that never come, come
    late, come and go, rows that expire, a jump past the epoch's span and a restore: every
    cell's times are the model's, the checkpoint holds them, and a restored bank goes on
    identically."""
    rng = np.random.default_rng(seed)
    det, model = BankCusum(k, capacity=2), CellRings(32)
    never = rng.random(k) < 0.2  # metrics this fleet never sends
    late = rng.integers(0, 60, k) * (rng.random(k) < 0.4)  # metrics that begin later
    flicker = rng.random(k) < 0.3  # metrics some records lack
    clock = np.full(n_rows, 1.7e9) + rng.uniform(0, 5, n_rows)
    twin: BankCusum | None = None
    irregular = 0  # the most cells not plainly following their row at once
    for w in range(140):
        if w < 40:
            rows = np.arange(n_rows)
        else:
            rows = rng.permutation(n_rows)[: rng.integers(1, n_rows + 1)]
        if w == 90:
            clock += 1.1 * _DAY_12  # the epoch moves
        clock[rows] += rng.choice([10.0, 10.0, 20.0, 0.25])
        x = rng.normal(1.0, 0.1, (rows.size, k))
        x[:, never | (w < late)] = np.nan
        if w >= 40:
            x[(rng.random((rows.size, k)) < 0.3) & flicker] = np.nan
        if w >= 60 and rng.random() < 0.05:
            gone = rng.choice(n_rows, size=2)
            model.forget(det, gone)
            if twin is not None:
                twin.forget(gone)
        model.wave(det, rows, clock[rows].copy(), x)
        if twin is not None:
            twin.update(rows, clock[rows].copy(), x)
        if w == 110:
            blob = det.snapshot()
            twin = BankCusum.restore(blob)
            assert twin.snapshot() == blob
        irregular = max(irregular, det._times.irregular)
        cells = det._rows * k
        assert _same_bits(bank_state.state_arrays(det)["tring"], model.t[:, :cells]), w
    assert twin is not None
    assert twin.snapshot() == det.snapshot()
    if (~never).sum() >= 2 and (flicker & ~never).any():
        assert irregular > 0  # the exceptions were exercised


def test_a_stream_without_a_metric_holds_no_ring_for_it() -> None:
    """A metric a stream never sends costs no ring; one that stopped costs one, its own."""
    det = BankCusum(3)
    x = np.ones((1, 3))
    x[0, 2] = np.nan
    for w in range(5):
        det.update(np.array([0]), np.array([10.0 * w + 1e9]), x)
    assert det._times.own[:3].tolist() == [FOLLOW, FOLLOW, EMPTY]
    x[0, 1] = np.nan
    det.update(np.array([0]), np.array([1e9 + 60.0]), x)
    col = int(det._times.own[1]) - 1
    assert col >= 0  # kept its five times while cell 0 moved on
    assert det._times.irregular == 2
    det.forget(np.array([0, 0]))  # a row twice: its ring goes back once
    assert det._times.irregular == 0
    assert det._times.free == [col]
    assert det._times.own[:3].tolist() == [FOLLOW] * 3


def test_a_metric_that_comes_later_shares_its_streams_ring() -> None:
    """A metric that first comes windows after the others (a load model's output, say)
    follows its stream's ring rotated, with no ring of its own."""
    det, model = BankCusum(3), CellRings(32)
    rows = np.array([0, 1])
    for w in range(80):
        x = np.ones((2, 3))
        if w < 7:
            x[:, 1] = np.nan
        model.wave(det, rows, np.array([1e9, 1e9 + 3.0]) + 10.0 * w, x)
        assert _same_bits(bank_state.state_arrays(det)["tring"], model.t[:, : 2 * 3]), w
    assert det._times.used == 0
    assert det._times.irregular == 2  # cell 1 of each row: rotated by 7 slots
    blob = det.snapshot()
    back = BankCusum.restore(blob)
    assert back._times.used == 0
    assert back.snapshot() == blob
