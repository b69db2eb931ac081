"""Sources: the in-process simulator and recordings feed the same pipeline to the same alerts."""

from __future__ import annotations

from pathlib import Path

import pytest
import zstandard

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.daemon.runner import Runner
from monitor.errors import RecordingError
from monitor.sinks.memory import ListSink
from monitor.sources.recording import (
    RecordingSource,
    create_recording,
    is_change_line,
    iter_lines,
)
from monitor.sources.simulated import SimulatorSource
from monitor.wire import Alert
from sim.recording import write_recording
from sim.run import simulate


async def _alerts(source) -> list[Alert]:
    sink = ListSink()
    await Runner(source, Pipeline(Settings()), [sink]).run()
    return sink.alerts


async def test_simulator_source_finds_the_labelled_incident() -> None:
    """In process, the pool_regression scenario yields an alert matching its label."""
    sim = simulate("pool_regression", devices=48, duration_s=900.0, seed=5)
    alerts = await _alerts(SimulatorSource(sim, Settings().kafka.topics, partitions=3))
    truth = sim.labels["incidents"][0]
    assert alerts
    assert {a.id for a in alerts} == {alerts[0].id}
    a = alerts[-1]
    assert (a.scope.pool, a.layers, a.metric) == (truth["scope"]["pool"], ["attention"], "mfu")
    assert a.suggestion.change_id == truth["change_id"]
    assert abs(a.onset_ts - truth["onset_ts"]) <= 2 * sim.labels["window_s"]


async def test_recording_replays_like_the_simulator(tmp_path: Path) -> None:
    """A written recording gives the same incident (id, scope) as the in-process source."""
    rec = tmp_path / "r.jsonl.gz"
    write_recording(simulate("pool_regression", devices=48, duration_s=900.0, seed=5), rec)
    from_file = await _alerts(RecordingSource(rec, Settings().kafka.topics, batch_size=48))
    in_proc = await _alerts(
        SimulatorSource(
            simulate("pool_regression", devices=48, duration_s=900.0, seed=5),
            Settings().kafka.topics,
        )
    )
    assert [a.id for a in from_file][:1] == [a.id for a in in_proc][:1]
    assert from_file[-1].scope.devices == in_proc[-1].scope.devices


def test_change_lines_are_routed_by_shape() -> None:
    """A change event has `kind` and no `layers`; everything else is a window record."""
    assert is_change_line(b'{"v":1,"ts":1,"id":"c","kind":"driver","scope":{}}')
    assert not is_change_line(b'{"v":1,"ts":1,"device":"d","layers":[{"type":"all"}]}')
    assert not is_change_line(b'{"v":1,"ts":1,"device":"d","layers":[],"kind":"x"}')


def test_zstd_recording_holds_the_same_lines_as_gzip(tmp_path: Path) -> None:
    """The simulator writes .jsonl.zst; it reads back line for line like its .jsonl.gz."""
    sim = simulate("pool_regression", devices=16, duration_s=120.0, seed=2)
    n_gz = write_recording(sim, tmp_path / "r.jsonl.gz")
    n_zst = write_recording(sim, tmp_path / "r.jsonl.zst")
    assert n_gz == n_zst == 16 * 12
    gz = list(iter_lines(tmp_path / "r.jsonl.gz"))
    assert list(iter_lines(tmp_path / "r.jsonl.zst")) == gz
    assert (tmp_path / "r.labels.json").is_file()


def test_zstd_reads_across_frames_and_rejects_garbage(tmp_path: Path) -> None:
    """Two concatenated frames are one recording; a file that is not zstd is one error."""
    path = tmp_path / "two.jsonl.zst"
    c = zstandard.ZstdCompressor()
    path.write_bytes(c.compress(b'{"a":1}\n') + c.compress(b'{"b":2}\n'))
    assert [n for n, _ in iter_lines(path)] == [1, 2]
    bad = tmp_path / "bad.jsonl.zst"
    bad.write_bytes(b"not zstd at all\n")
    with pytest.raises(RecordingError, match=r"bad\.jsonl\.zst"):
        list(iter_lines(bad))


@pytest.mark.parametrize("name", ["w.jsonl", "w.jsonl.gz", "w.jsonl.zst"])
def test_create_recording_round_trips(tmp_path: Path, name: str) -> None:
    """What `create_recording` writes, `iter_lines` reads, for every recording suffix."""
    with create_recording(tmp_path / name) as f:
        f.write(b'{"x":1}\n\n{"x":2}\n')
    assert list(iter_lines(tmp_path / name)) == [(1, b'{"x":1}'), (3, b'{"x":2}')]
    with pytest.raises(RecordingError, match="must end in"):
        create_recording(tmp_path / "w.txt")
