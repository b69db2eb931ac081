"""The checkpointer's restore policy, without a broker: which checkpoint wins, and why not."""

from __future__ import annotations

import zlib

import msgspec
from factories import fleet
from structlog.testing import capture_logs

from monitor.checkpoint.checkpointer import Checkpointer
from monitor.checkpoint.format import Checkpoint, offset_key
from monitor.config import KafkaSettings, Settings
from monitor.core.pipeline import Pipeline
from monitor.core.state import STATE_VERSION


class _Store:
    """Only what `Checkpointer` reads of a store when restoring."""

    kafka = KafkaSettings(bootstrap_servers="unused:9092")


class _Offsets:
    def delivered(self) -> dict:
        return {}


def _checkpoint(payload: bytes, cid: str, offset: int) -> Checkpoint:
    offsets = {offset_key("flopwatch.samples", 0): offset}
    return Checkpoint("g/t/0", cid, 0, offsets, None, 0.0, zlib.compress(payload))


async def test_another_state_version_is_counted_and_the_older_checkpoint_used() -> None:
    """Newest first: a checkpoint of another state version is skipped, counted and logged;
    the next (this build's) is restored; with none left the partition starts fresh."""
    source = Pipeline(Settings())
    for batch in fleet(12, devices=8):
        source.process(batch)
    ours = source.snapshot_partition(0)
    theirs = msgspec.msgpack.decode(ours)
    theirs["v"] = STATE_VERSION + 1
    pipeline = Pipeline(Settings())
    cp = Checkpointer(_Offsets(), pipeline, _Store(), Settings().checkpoint)  # type: ignore[arg-type]
    newer = _checkpoint(msgspec.msgpack.encode(theirs), "new", 120)
    with capture_logs() as logs:
        assert await cp._restore_partition(0, [newer, _checkpoint(ours, "old", 100)]) == 100
    assert cp.stats.version_mismatches == 1
    assert cp.stats.restores == 1
    assert set(pipeline.partitions[0].table.devices) == set(source.partitions[0].table.devices)
    assert [e["event"] for e in logs] == ["checkpoint of another state version, not restored"]
    fresh = Pipeline(Settings())
    cp = Checkpointer(_Offsets(), fresh, _Store(), Settings().checkpoint)  # type: ignore[arg-type]
    assert await cp._restore_partition(0, [newer]) is None
    assert (cp.stats.version_mismatches, cp.stats.restores) == (1, 0)
    assert 0 not in fresh.partitions
