"""Checkpoints: stop anywhere, restore per partition, and the future is unchanged."""

from __future__ import annotations

import msgspec
import numpy as np
from factories import fleet

from monitor.config import AlertSettings, DetectorSettings, Settings
from monitor.core.pipeline import Pipeline
from monitor.detect.bank import BankCusum
from monitor.detect.cusum import Cusum


def _run(pipeline: Pipeline, batches) -> list[bytes]:
    enc = msgspec.json.Encoder(order="deterministic")
    return [enc.encode(a) for b in batches for a in pipeline.process(b).alerts]


def test_restore_mid_incident_gives_identical_alerts() -> None:
    """Checkpoint every partition mid-stream; a fresh pipeline continues byte-identically."""
    batches = fleet(80, regress_at=40, change_at=39) + fleet(130, seed=9)[80:]
    cut = 44  # after the regression started, before it pages
    straight = Pipeline(Settings())
    expected = _run(straight, batches)
    assert expected

    first = Pipeline(Settings())
    head = _run(first, batches[:cut])
    blobs = {p: first.snapshot_partition(p) for p in first.partitions}
    incidents = first.snapshot_incidents()

    second = Pipeline(Settings())
    for p, blob in blobs.items():
        second.restore_partition(p, blob)
    second.restore_incidents(incidents)
    assert head + _run(second, batches[cut:]) == expected


def test_partition_snapshot_is_per_partition() -> None:
    """Each partition's bytes restore only that partition's devices."""
    p = Pipeline(Settings())
    _run(p, fleet(5))
    blob = p.snapshot_partition(1)
    q = Pipeline(Settings())
    q.restore_partition(1, blob)
    assert set(q.partitions) == {1}
    assert set(q.partitions[1].table.devices) == set(p.partitions[1].table.devices)
    assert len(q.partitions[1].table.devices) == 8


def _settings(**detector) -> Settings:
    return Settings(detector=DetectorSettings(**detector))


def test_restore_applies_the_configured_parameters() -> None:
    """A raised `h` (and a new stream TTL) applies after a restart: the state carries on
    under it (it used to come back with the checkpoint's parameters, so a retuned
    deployment kept paging as before)."""
    batches = fleet(60)
    first = Pipeline(Settings())
    _run(first, batches[:40])
    blobs = {p: first.snapshot_partition(p) for p in first.partitions}

    same = Pipeline(Settings())
    retuned = Pipeline(_settings(h=13.0, stream_ttl_s=600.0))
    for p, blob in blobs.items():
        assert set(same.restore_partition(p, blob).values()) == {"kept"}
        assert set(retuned.restore_partition(p, blob).values()) == {"retuned"}
    assert retuned.stats.detector_restores["retuned"] == 4 * len(blobs)
    for p, st in retuned.partitions.items():
        old = first.partitions[p]
        assert (st.table.ttl_s, old.table.ttl_s) == (600.0, 3600.0)
        for name in ("layer", "device", "pool_layer"):
            det, was = st.detectors[name], old.detectors[name]
            assert isinstance(det, BankCusum)
            assert isinstance(was, BankCusum)
            assert (det.h, was.h) == (13.0, 11.0)
            cells = det._s["mu"].size  # a snapshot holds the rows in use
            assert cells > 0
            for key, arr in was._s.items():  # the state, bit for bit
                np.testing.assert_array_equal(det._s[key], arr[:cells])
            np.testing.assert_array_equal(det._ring, was._ring[:, :cells])
    # Both continue without error; the retuned one is the same pipeline but for h.
    assert _run(same, batches[40:]) == _run(first, batches[40:])
    _run(retuned, batches[40:])


def test_restore_under_another_shape_or_kind_starts_fresh() -> None:
    """A ring length or a kind the checkpoint's state cannot serve: fresh detectors."""
    first = Pipeline(Settings())
    _run(first, fleet(40))
    blob = first.snapshot_partition(1)
    for settings, kind in ((_settings(params={"history": 48.0}), BankCusum),
                           (_settings(kind="cusum"), Cusum)):  # fmt: skip
        q = Pipeline(settings)
        assert set(q.restore_partition(1, blob).values()) == {"reset"}
        st = q.partitions[1]
        assert isinstance(st.detectors["layer"], kind)
        # The streams are kept; their detectors start over (no row has state).
        assert set(st.table.devices) == set(first.partitions[1].table.devices)
        det = st.detectors["layer"]
        counts = det._s["n"] if isinstance(det, BankCusum) else det._arrays["n"]
        assert int(counts.max()) == 0
        assert q.stats.detector_restores["reset"] == 4
        _run(q, fleet(50)[40:])


def test_restored_incidents_use_the_configured_windows() -> None:
    """The correlator's grouping window and the advisor's look-back come from the settings."""
    first = Pipeline(Settings())
    _run(first, fleet(60, regress_at=40, change_at=39))
    blob = first.snapshot_incidents()
    alerts = AlertSettings(group_window_s=120.0, change_lookback_s=3600.0)
    q = Pipeline(Settings(alerts=alerts))
    q.restore_incidents(blob)
    assert first.correlator.incidents
    assert len(q.correlator.incidents) == len(first.correlator.incidents)
    assert (q.correlator.group_window_s, first.correlator.group_window_s) == (120.0, 300.0)
    assert (q.advisor.lookback_s, first.advisor.lookback_s) == (3600.0, 6 * 3600.0)
    assert q.lifecycle.advisor is q.advisor
