"""The factory and every kind behind it obey the same `Detector` contract."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.detect import (
    DEFAULT_KIND,
    KINDS,
    REGISTRY,
    StateShapeError,
    detector_params,
    make_detector,
    restore_configured,
    restore_detector,
)
from monitor.detect.bank import BankCusum
from monitor.detect.base import Detections, Detector
from monitor.detect.cusum import Cusum
from monitor.detect.river import RiverDetector

FIELDS = ("rows", "cols", "detected_ts", "onset_ts", "before", "after", "score")


def feed(det: Detector, x: np.ndarray, t0: float = 0.0) -> Detections:
    """x: (T, n_rows, K) dense waves, 10 s apart."""
    rows = np.arange(x.shape[1], dtype=np.int64)
    return Detections.concat(
        [det.update(rows, np.full(rows.size, t0 + 10.0 * t), x[t]) for t in range(x.shape[0])]
    )


def step_data(seed: int = 0) -> np.ndarray:
    """Three streams x two metrics; stream 1 metric 0 steps up by 10 sigma at window 250."""
    rng = np.random.default_rng(seed)
    x = 10.0 + 0.1 * rng.standard_normal((400, 3, 2))
    x[250:, 1, 0] += 1.0
    return x


def test_default_is_the_bank() -> None:
    """The engine is the default, and the kinds are the documented five."""
    assert DEFAULT_KIND == "bank"
    assert set(KINDS) == {"bank", "cusum", "adwin", "page_hinkley", "kswin"}
    assert isinstance(make_detector("bank", 2), BankCusum)
    assert isinstance(make_detector("cusum", 2), Cusum)
    assert isinstance(make_detector("adwin", 2), RiverDetector)


def test_unknown_kind_names_the_valid_ones() -> None:
    """A typo in detector.kind says what would have worked."""
    with pytest.raises(ValueError, match="valid kinds: bank, cusum, adwin, page_hinkley, kswin"):
        make_detector("focus", 1)


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_parameter_names_the_valid_ones(kind: str) -> None:
    """Parameters are checked per kind, and the message lists what the kind takes."""
    with pytest.raises(ValueError, match="valid:"):
        make_detector(kind, 1, {"no_such_knob": 1.0})
    assert "capacity" in detector_params(kind)


def test_scale_floor_below_float32_resolution_is_refused() -> None:
    """The ring holds a sample near its level to float32's step: a scale floor under it is
    refused (with none, a series at 1e8 with unit noise paged on rounding noise)."""
    with pytest.raises(ValueError, match=r"rel_floor >= 1\.19e-07 required"):
        make_detector("bank", 1, {"rel_floor": 0.0})
    det = make_detector("bank", 1, {"rel_floor": 2.0**-23, "min_rel_change": 0.0})
    rng = np.random.default_rng(0)
    alarms = 0
    for t in range(3000):
        x = np.array([[1e8 + rng.standard_normal()]])
        alarms += len(det.update(np.zeros(1, dtype=np.int64), np.array([float(t)]), x))
    assert alarms == 0


@pytest.mark.parametrize(("kind", "name"), [("bank", "burn_in"), ("cusum", "burn_in")])
def test_window_counts_must_be_whole(kind: str, name: str) -> None:
    """A count given as 40.0 (TOML, env) is taken as 40; 32.5 is refused, not truncated."""
    with pytest.raises(ValueError, match=f"{name} must be a whole number, got 32.5"):
        make_detector(kind, 1, {name: 32.5})
    det = make_detector(kind, 1, {name: 24.0})
    value = det.params()[name]
    assert value == 24
    assert type(value) is int


def test_parameters_reach_the_engine() -> None:
    """Config values are passed through as constructor keywords."""
    det = make_detector("bank", 1, {"h": 20.0, "burn_in": 16, "min_rel_change": 0.1})
    assert isinstance(det, BankCusum)
    assert (det.h, det.cfg.burn_in, det.cfg.min_rel_change) == (20.0, 16, 0.1)
    pk = make_detector("page_hinkley", 1, {"threshold": 7.0})
    assert isinstance(pk, RiverDetector)
    assert pk.river_params["threshold"] == 7.0


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_finds_a_clear_step_with_a_sane_onset(kind: str) -> None:
    """A 10-sigma step on one cell is found on that cell, onset before detection, levels right."""
    hits = feed(make_detector(kind, 2), step_data())
    on = (hits.rows == 1) & (hits.cols == 0) & (hits.detected_ts >= 2500.0)
    assert on.any()
    i = int(np.flatnonzero(on)[0])
    assert hits.detected_ts[i] <= 10.0 * 330
    assert hits.onset_ts[i] <= hits.detected_ts[i]
    assert hits.onset_ts[i] >= 10.0 * 150
    assert hits.after[i] > hits.before[i]
    assert np.all(hits.score >= 1.0)
    for f in FIELDS:
        assert getattr(hits, f).shape == hits.rows.shape


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_tolerates_missing_cells(kind: str) -> None:
    """NaN cells are skipped: an all-NaN column never produces a detection."""
    x = step_data(1)
    x[:, :, 1] = np.nan
    hits = feed(make_detector(kind, 2), x)
    assert not np.any(hits.cols == 1)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_round_trips_through_restore_detector(kind: str) -> None:
    """snapshot -> restore_detector -> the same checkpoint and identical future outputs.

    Exact for the bank and the simple CUSUM always; a river cell is rebuilt by replaying
    its last `history` samples, exact here because every cell's life so far fits in them."""
    x = step_data(2)
    det = make_detector(kind, 2, {"capacity": 2})
    feed(det, x[:200])
    blob = det.snapshot()
    twin = restore_detector(blob)
    assert type(twin) is type(det)
    assert twin.snapshot() == blob
    a, b = feed(det, x[200:], t0=2000.0), feed(twin, x[200:], t0=2000.0)
    assert len(a)
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert det.snapshot() == twin.snapshot()


@pytest.mark.parametrize(
    "kind", [k for k, cls in REGISTRY.items() if issubclass(cls, RiverDetector)]
)
def test_river_kinds_restore_from_their_recent_samples(kind: str) -> None:
    """Past `history` samples a restored river cell starts from the last `history` only
    (it may then differ from an uninterrupted run), and still finds the step."""
    x = step_data(2)
    det = make_detector(kind, 2, {"capacity": 2, "history": 100})
    feed(det, x[:200])
    twin = restore_detector(det.snapshot())
    assert isinstance(twin, RiverDetector)
    assert twin.snapshot() == det.snapshot()
    hits = feed(twin, x[200:], t0=2000.0)
    on = (hits.rows == 1) & (hits.cols == 0) & (hits.detected_ts >= 2500.0)
    assert on.any()
    assert hits.onset_ts[on][0] >= 2000.0


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_forgets_and_grows(kind: str) -> None:
    """forget() on any row is safe, and rows past the initial capacity just work."""
    det = make_detector(kind, 1, {"capacity": 1})
    x = np.full((50, 5, 1), 3.0)
    feed(det, x)
    det.forget(np.array([0, 4, 99], dtype=np.int64))
    assert len(det.update(np.array([7]), np.array([600.0]), np.array([[3.0]]))) == 0


def test_checkpoints_without_a_kind_tag_are_refused() -> None:
    """Only the tagged envelope is a detector checkpoint."""
    for blob in (b"garbage", b"PK\x03\x04"):
        with pytest.raises(ValueError, match="not a detector checkpoint"):
            restore_detector(blob)


def test_every_kind_is_one_registered_class() -> None:
    """The registry maps each kind to its class; the class names its kind and parameters,
    and the whole protocol is there (drains are {} where a kind counts nothing)."""
    assert tuple(REGISTRY) == KINDS
    for kind, cls in REGISTRY.items():
        assert cls.kind == kind
        det = make_detector(kind, 2, {"capacity": 3})
        assert type(det) is cls
        assert (det.n_metrics, det.capacity) == (2, 3)
        assert tuple(cls.param_types()) == detector_params(kind)
        assert set(det.params()) == set(detector_params(kind)) - {"capacity"}
        assert make_detector(kind, 2, det.params()).params() == det.params()
        assert isinstance(det.drain_stats(), dict)
        assert isinstance(det.drain_warm_starts(), dict)
    assert make_detector("cusum", 1).drain_stats() == {}
    assert make_detector("kswin", 1).drain_warm_starts() == {}


def _fed(det, steps: int, at: int = 10_000, t0: int = 0) -> int:
    """Feed one noisy stream from window `t0` (a 4-sd step from window `at`); the alarms."""
    rng = np.random.default_rng(5 + t0)
    found = 0
    for t in range(t0, t0 + steps):
        x = np.array([[10.0 + rng.standard_normal() + (4.0 if t >= at else 0.0)]])
        found += len(det.update(np.zeros(1, dtype=np.int64), np.array([float(t)]), x))
    return found


def test_restore_configured_keeps_retunes_or_resets() -> None:
    """The configured parameters win over a checkpoint's; the state carries on where its
    shape allows."""
    det = make_detector("bank", 1)
    _fed(det, 600)
    blob = det.snapshot()
    kept, how = restore_configured(blob, "bank", 1, {})
    assert how == "kept"
    assert kept.snapshot() == blob
    high, how = restore_configured(blob, "bank", 1, {"h": 1000.0})
    assert how == "retuned"
    assert isinstance(high, BankCusum)
    assert high.h == 1000.0
    assert high.snapshot() != blob
    # The same state, now under h 1000: the step the kept detector finds goes unreported.
    assert _fed(kept, 100, at=650, t0=600) >= 1
    assert _fed(high, 100, at=650, t0=600) == 0
    for params in ({"history": 48}, {"n_shifts": 4}):
        fresh, how = restore_configured(blob, "bank", 1, params)
        assert how == "reset"
        assert isinstance(fresh, BankCusum)
        assert fresh.capacity >= 1
        assert int(fresh._s["n"].max()) == 0
    other, how = restore_configured(blob, "adwin", 1, {})
    assert how == "reset"
    assert isinstance(other, RiverDetector)
    assert restore_configured(blob, "bank", 2, {})[1] == "reset"


def test_retuned_shorter_windows_saturate_the_counts() -> None:
    """Windows shorter than the checkpoint's counts: the counts stop at the new windows."""
    det = make_detector("bank", 1)
    _fed(det, 1500)
    short = {"baseline_window": 64, "scale_window": 128, "ar_window": 256}
    new, how = restore_configured(det.snapshot(), "bank", 1, short)
    assert how == "retuned"
    assert isinstance(new, BankCusum)
    assert (int(new._s["nb"].max()), int(new._s["ns"].max())) == (64, 256)
    _fed(new, 300, t0=1500)
    assert np.isfinite(new._s["mu"]).all()
    assert np.isfinite(new._s["sig"]).all()


def test_river_kinds_reset_on_any_parameter_change() -> None:
    """River objects are built with their parameters: another delta means fresh ones."""
    det = make_detector("adwin", 1, {"delta": 0.002})
    _fed(det, 200)
    blob = det.snapshot()
    assert restore_configured(blob, "adwin", 1, {"delta": 0.002})[1] == "kept"
    assert restore_configured(blob, "adwin", 1, {"delta": 0.01})[1] == "reset"


@pytest.mark.parametrize(("kind", "change"), [("cusum", {"k": 0.7}), ("kswin", {"alpha": 0.01})])
def test_kinds_without_retuning_refuse_other_parameters(kind: str, change: dict) -> None:
    """A kind whose state is built with all its parameters restores only under its own:
    `restore(blob, params)` raises StateShapeError otherwise, and the factory resets."""
    det = make_detector(kind, 1)
    _fed(det, 100)
    blob = det.snapshot()
    same = type(det).restore(blob, params=det.params())
    assert same.snapshot() == blob
    with pytest.raises(StateShapeError):
        type(det).restore(blob, params=det.params() | change)
    assert restore_configured(blob, kind, 1, change)[1] == "reset"
    assert restore_configured(blob, kind, 1, {})[1] == "kept"


def _checkpoint_of_many() -> bytes:
    """50 streams of mixed noise after 1,200 windows (counts past the shorter windows)."""
    det = make_detector("bank", 1)
    rng = np.random.default_rng(11)
    rows, ar = np.arange(50), np.zeros(50)
    for t in range(1200):
        ar = 0.7 * ar + rng.standard_normal(50)
        x = 10.0 + np.where(rows % 2 == 0, rng.standard_t(3, 50), ar)
        det.update(rows, np.full(50, float(t)), x[:, None])
    return det.snapshot()


_MANY = _checkpoint_of_many()


@settings(max_examples=25, deadline=None)
@given(
    h=st.floats(5.0, 30.0),
    min_rel_change=st.floats(0.0, 0.2),
    spread_veto=st.floats(0.0, 3.0),
    baseline_window=st.integers(16, 2048),
    scale_window=st.integers(16, 4096),
    ar_window=st.integers(16, 8192),
    lrv_window=st.integers(0, 64),
    ma_max=st.sampled_from([0.0, 0.9]),
)
def test_retuned_state_carries_on_under_any_new_parameters(**params: float) -> None:
    """Any parameters that keep the state's shape: the state as saved (counts saturated at
    shorter windows), the new parameters in force, and finite estimates afterwards."""
    det, how = restore_configured(_MANY, "bank", 1, params)
    assert isinstance(det, BankCusum)
    saved = restore_detector(_MANY)
    assert isinstance(saved, BankCusum)
    assert how == ("kept" if det.params() == saved.params() else "retuned")
    want = make_detector("bank", 1, params)
    assert isinstance(want, BankCusum)
    assert det.params() == want.params()
    for name, arr in saved._s.items():
        if name == "nb":
            np.testing.assert_array_equal(det._s[name], np.minimum(arr, det.cfg.baseline_window))
        elif name in ("ns", "na"):
            np.testing.assert_array_equal(det._s[name], np.minimum(arr, det._ns_max))
        else:
            np.testing.assert_array_equal(det._s[name], arr)
    rng = np.random.default_rng(3)
    rows = np.arange(50)
    for t in range(1200, 1300):
        det.update(rows, np.full(50, float(t)), 10.0 + rng.standard_normal((50, 1)))
    assert np.isfinite(det._s["mu"]).all()
    assert np.isfinite(det._s["sig"]).all()
    assert np.isfinite(det._s["phi"]).all()
