"""The public simulator API the monitor's end-to-end tests build on (priority-1 scenario)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

import sim
from sim.recording import write_recording
from sim.run import Simulation, SimWindow, simulate
from sim.scenarios import SCENARIOS, UnknownScenario
from sim.testing import decode_run, series, span_mean

START = 1_764_432_000.0


@pytest.fixture(scope="module")
def pool_run() -> Simulation:
    return simulate(
        "pool_regression", devices=64, duration_s=600.0, seed=7, window_s=10.0, start_ts=START
    )


def test_reexports() -> None:
    """The package root re-exports the API the monitor imports."""
    assert sim.simulate is simulate
    assert sim.SCENARIOS is SCENARIOS
    assert sim.SimWindow is SimWindow
    for sc in SCENARIOS.values():
        assert sc.name
        assert sc.description
        assert sc.default_devices > 0
        assert sc.default_duration_s > 0


def test_unknown_scenario_is_a_key_error() -> None:
    """An unknown name raises UnknownScenario, a KeyError, naming the scenario."""
    with pytest.raises(KeyError) as info:
        simulate("no_such_scenario")
    assert isinstance(info.value, UnknownScenario)
    assert "no_such_scenario" in str(info.value)


def test_defaults_of_pool_regression() -> None:
    """Default pool_regression: 256 devices, 20 minutes, 120 windows of 10 s."""
    s = simulate("pool_regression")
    assert (s.devices, s.duration_s, s.n_windows) == (256, 1200.0, 120)
    pools = {p["name"]: p for p in s.labels["pools"]}
    assert set(pools) == {"train-a", "train-b"}
    assert pools["train-a"]["model"] == "llama-70b@v12"
    assert pools["train-b"]["model"] == "llama-8b@v3"
    assert pools["train-a"]["devices"] + pools["train-b"]["devices"] == 256


def test_same_seed_same_bytes() -> None:
    """Two runs with the same seed produce identical bytes; another seed does not."""

    def run(seed: int) -> list[tuple[float, list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]]:
        s = simulate("pool_regression", devices=24, duration_s=300.0, seed=seed)
        return [(w.ts, w.records, w.changes) for w in s.windows()]

    a, b, c = run(11), run(11), run(12)
    assert a == b
    assert a != c


def test_windows_can_be_iterated_twice(pool_run: Simulation) -> None:
    """windows() restarts the run each time it is called."""
    first = [w.records for w in pool_run.windows()][:3]
    second = [w.records for w in pool_run.windows()][:3]
    assert first == second


def test_every_record_decodes_and_is_keyed_by_device(pool_run: Simulation) -> None:
    """Every window carries one valid record per device, keyed by its device id, in ts order."""
    dec = decode_run(pool_run)
    assert len(dec.ts) == 60
    assert dec.ts == sorted(dec.ts)
    assert dec.ts[0] == START + 10.0
    for ts in dec.ts:
        recs = dec.records[ts]
        assert len(recs) == 64
        assert len({r.device for r in recs}) == 64
        assert {(r.ts, r.window_s, r.hw, r.dtype) for r in recs} == {(ts, 10.0, "h100-sxm", "bf16")}
    rec = dec.records[dec.ts[0]][0]
    assert rec.device.startswith(f"{rec.host}/gpu")
    assert {"attention", "mlp", "embedding", "norm", "allreduce"} <= {x.type for x in rec.layers}


def test_change_event_lands_in_its_window(pool_run: Simulation) -> None:
    """The kernel_lib change is emitted once, in the window whose span contains its ts."""
    dec = decode_run(pool_run)
    assert len(dec.changes) == 1
    win_ts, key, value = dec.changes[0]
    ev = msgspec.json.decode(value)
    assert key == b"pool=train-a"
    assert ev["kind"] == "kernel_lib"
    assert ev["scope"] == {"pool": "train-a"}
    assert ev["id"].startswith("chg-")
    assert win_ts - 10.0 < ev["ts"] <= win_ts
    assert ev["ts"] == pytest.approx(START + 0.4 * 600.0, abs=10.0)
    assert pool_run.labels["changes"] == [ev]


def test_attention_regression_on_train_a_only(pool_run: Simulation) -> None:
    """One window after the change, train-a attention MFU drops ~15%; train-b does not move."""
    dec = decode_run(pool_run)
    inc = pool_run.labels["incidents"][0]
    change_ts = pool_run.labels["changes"][0]["ts"]
    onset = inc["onset_ts"]
    assert change_ts < onset <= change_ts + 10.0
    before = (onset - 100.0, onset)
    after = (onset, onset + 100.0)
    ts, a = series(dec, "mfu", "attention", pool="train-a")
    drop = span_mean(ts, a, after) / span_mean(ts, a, before) - 1.0
    assert -0.20 < drop < -0.10
    # the very first window after onset already shows it
    first = a[ts == onset + 10.0][0]
    assert first < 0.92 * span_mean(ts, a, before)
    ts_b, b = series(dec, "mfu", "attention", pool="train-b")
    assert abs(span_mean(ts_b, b, after) / span_mean(ts_b, b, before) - 1.0) < 0.02
    ts_f, fb = series(dec, "fallback_frac", "attention", pool="train-a")
    assert span_mean(ts_f, fb, before) == 0.0
    assert span_mean(ts_f, fb, after) == pytest.approx(0.4, abs=0.01)
    kernels_after = {
        lay.kernel
        for r in dec.records[onset + 10.0]
        if r.pool == "train-a"
        for lay in r.layers
        if lay.type == "attention"
    }
    kernels_before = {
        lay.kernel
        for r in dec.records[onset]
        if r.pool == "train-a"
        for lay in r.layers
        if lay.type == "attention"
    }
    assert kernels_before == {inc["kernels"]["attention"]["before"]}
    assert kernels_after == {inc["kernels"]["attention"]["after"]}
    assert kernels_before != kernels_after


def test_labels_describe_the_incident(pool_run: Simulation) -> None:
    """Labels name the scope, stage, bottleneck, change and the size of the move; JSON-ready."""
    lab = json.loads(json.dumps(pool_run.labels))
    for key in (
        "scenario",
        "seed",
        "devices",
        "window_s",
        "start_ts",
        "duration_s",
        "incidents",
        "changes",
    ):
        assert key in lab
    assert (lab["scenario"], lab["seed"], lab["devices"]) == ("pool_regression", 7, 64)
    (inc,) = lab["incidents"]
    scope = inc["scope"]
    assert scope["pool"] == "train-a"
    assert scope["level"] == "pool"
    assert scope["model"] == "llama-70b@v12"
    dec = decode_run(pool_run)
    train_a = {r.device for r in dec.records[dec.ts[0]] if r.pool == "train-a"}
    assert set(scope["devices"]) == train_a
    assert scope["device_count"] == len(train_a)
    assert inc["layers"] == ["attention"]
    assert inc["first_failing_stage"] == "lowering"
    assert inc["bottleneck"] == "kernel_selection"
    assert inc["change_id"] == lab["changes"][0]["id"]
    mfu = next(i for i in inc["indicators"] if i["name"] == "mfu" and i["layer"] == "attention")
    assert 0.3 < mfu["before"] < 0.7
    assert mfu["after"] / mfu["before"] == pytest.approx(0.85, abs=0.02)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_recording_round_trip(pool_run: Simulation, tmp_path: Path, suffix: str) -> None:
    """A recording holds every record and change in event-time order, plus labels next to it."""
    path = tmp_path / f"run{suffix}"
    n = write_recording(pool_run, path)
    assert n == 64 * 60
    raw = gzip.decompress(path.read_bytes()) if suffix.endswith(".gz") else path.read_bytes()
    lines = raw.splitlines()
    assert len(lines) == n + 1
    objs = [msgspec.json.decode(line) for line in lines]
    ts = [o["ts"] for o in objs]
    kinds = ["change" if "kind" in o else "record" for o in objs]
    assert kinds.count("change") == 1
    # change events precede the records of the window they landed in
    i = kinds.index("change")
    assert objs[i + 1]["ts"] >= ts[i]
    assert i == 0 or objs[i - 1]["ts"] < ts[i]
    rec_ts = [t for t, k in zip(ts, kinds, strict=True) if k == "record"]
    assert rec_ts == sorted(rec_ts)
    labels = json.loads((tmp_path / "run.labels.json").read_text())
    assert labels["incidents"][0]["id"] == pool_run.labels["incidents"][0]["id"]


def test_recording_is_reproducible(tmp_path: Path) -> None:
    """The same seed writes byte-identical gzip recordings."""
    s = simulate("pool_regression", devices=16, duration_s=120.0, seed=3)
    write_recording(s, tmp_path / "a.jsonl.gz")
    write_recording(s, tmp_path / "b.jsonl.gz")
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()


def test_device_ids_follow_hosts_of_eight() -> None:
    """Devices are node-NNN/gpuK with 8 per host, pools on whole hosts."""
    s = simulate("pool_regression", devices=40, duration_s=20.0, seed=1)
    (w,) = list(s.windows())[:1]
    devs = [k.decode() for k, _ in w.records]
    hosts = {d.split("/")[0] for d in devs}
    assert len(hosts) == 5
    assert all(d.split("/")[1] in {f"gpu{i}" for i in range(8)} for d in devs)
    pool_of_host: dict[str, set[str]] = {}
    for _, v in w.records:
        o = msgspec.json.decode(v)
        pool_of_host.setdefault(o["host"], set()).add(o["pool"])
    assert all(len(p) == 1 for p in pool_of_host.values())
    assert np.unique([next(iter(p)) for p in pool_of_host.values()]).size == 2
