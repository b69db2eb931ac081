"""Checkpoints: stop anywhere, restore per partition, and the future is unchanged."""

from __future__ import annotations

import msgspec
from factories import fleet

from monitor.config import Settings
from monitor.pipeline import Pipeline


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
