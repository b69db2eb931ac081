"""`flopwatch cut`: slices by time and scope, consistent keyed renaming, exit-2 misuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from monitor.cli import main
from monitor.daemon.cut import Renamer
from monitor.sources.recording import iter_lines
from sim.recording import write_recording
from sim.run import simulate

START = 1_764_432_000.0


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pool_regression on 48 devices (train-a regresses after chg-39856; train-b is healthy)."""
    path = tmp_path_factory.mktemp("cut") / "pool.jsonl.gz"
    write_recording(simulate("pool_regression", devices=48, seed=11), path)
    return path


def _replay(path: Path, out: Path, *batch: str) -> list[dict[str, Any]]:
    assert main(["replay", str(path), "--alerts-out", str(out), *batch]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for _, line in iter_lines(path)]


def _renamed(a: dict[str, Any], name: Renamer) -> dict[str, Any]:
    """An alert of the original recording as it reads with the names replaced."""
    s = a["scope"]
    pool, model = name("pool", s["pool"]), name("model", s["model"])
    scope = s | {"pool": pool, "model": model,
                 "hosts": sorted(name("host", h) for h in s["hosts"]),
                 "devices": sorted(name("device", d) for d in s["devices"])}  # fmt: skip
    sug = a["suggestion"] | {"scope": {"pool": pool}}
    return a | {"scope": scope, "suggestion": sug,
                "summary": a["summary"].replace(s["pool"], pool)}  # fmt: skip


def _sorted_scope(a: dict[str, Any]) -> dict[str, Any]:
    s = a["scope"]
    return a | {"scope": s | {"hosts": sorted(s["hosts"]), "devices": sorted(s["devices"])}}


def test_anonymized_cut_replays_to_the_same_alert_records_renamed(
    recording: Path, tmp_path: Path
) -> None:
    """The first 15 minutes, renamed: every alert record up to then comes back with the
    names replaced and nothing else changed (the id hashes the new names: one for one)."""
    cut = tmp_path / "cut.jsonl.zst"
    salt = ["--anonymize", "--salt", "s3cret"]
    assert main(["cut", str(recording), "--out", str(cut), "--to", "15m", *salt]) == 0
    # One window (48 records) per batch: alert records are sent as a live consumer would.
    original = _replay(recording, tmp_path / "a.jsonl", "--batch-size", "48")
    original = [a for a in original if a["ts"] <= START + 900]
    renamed = _replay(cut, tmp_path / "b.jsonl", "--batch-size", "48")
    assert len(original) >= 3
    name = Renamer(b"s3cret")
    ids = {a["id"]: b["id"] for a, b in zip(original, renamed, strict=True)}
    assert len(set(ids.values())) == len(ids)
    assert all(k != v for k, v in ids.items())
    expected = [_sorted_scope(_renamed(a, name)) | {"id": ids[a["id"]]} for a in original]
    assert expected == [_sorted_scope(b) for b in renamed]
    lines = _lines(cut)
    assert not any(n in json.dumps(lines) for n in ("train-", "node-", "llama", "ci-bot"))
    (change,) = [ln for ln in lines if "kind" in ln]
    assert change["id"] == "chg-39856"
    assert change["scope"] == {"pool": name("pool", "train-a")}
    assert "author" not in change
    assert "url" not in change
    assert max(ln["ts"] for ln in lines) <= START + 900


def test_pool_cut_pages_the_same_incident(recording: Path, tmp_path: Path) -> None:
    """Only train-a, renamed: the same incident pages (onset, detection, what, where,
    which rollback); the healthy pool and its hosts are gone from the recording."""
    cut = tmp_path / "a.jsonl.gz"
    argv = ["cut", str(recording), "--out", str(cut), "--pool", "train-a", "--anonymize"]
    assert main(argv) == 0
    assert {ln.get("pool") for ln in _lines(cut) if "layers" in ln} == {
        next(ln["pool"] for ln in _lines(cut) if "layers" in ln)
    }

    def first(alerts: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        seen: dict[str, tuple[Any, ...]] = {}
        for a in alerts:
            seen.setdefault(a["id"], (a["onset_ts"], a["detected_ts"], a["metric"], a["layers"],
                                      a["scope"]["level"], a["severity"], a["first_failing_stage"],
                                      a["bottleneck"], a["suggestion"]["change_id"]))  # fmt: skip
        return list(seen.values())

    original = first(_replay(recording, tmp_path / "a.jsonl"))
    assert len(original) == 1
    assert first(_replay(cut, tmp_path / "b.jsonl")) == original


def test_scope_and_time_select_records_and_the_changes_that_scope_them(tmp_path: Path) -> None:
    """A change is kept when it lands before --to and scopes a kept stream (fleet-wide
    ones always); renaming is consistent and depends on the salt."""
    rec = tmp_path / "r.jsonl"
    rows = [
        {"v": 1, "ts": START + 5, "id": "c-fleet", "kind": "driver", "scope": {}},
        {"v": 1, "ts": START + 6, "id": "c-b", "kind": "driver", "scope": {"pool": "b"}},
        {"v": 1, "ts": START + 7, "id": "c-h1", "kind": "model", "scope": {"host": "h1"},
         "from": "m@1", "to": "m@2"},
    ]  # fmt: skip
    for k in range(1, 7):
        for dev, host, pool in (("d1", "h1", "a"), ("d2", "h2", "b")):
            rows.append({"v": 1, "ts": START + 10 * k, "window_s": 10.0, "device": dev,
                         "host": host, "pool": pool, "model": "m@1", "layers": []})  # fmt: skip
    rows.append({"v": 1, "ts": START + 100, "id": "c-late", "kind": "driver", "scope": {}})
    rec.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    out = tmp_path / "o.jsonl"
    assert main(["cut", str(rec), "--out", str(out), "--pool", "a", "--from", "20s",
                 "--to", str(START + 40)]) == 0  # fmt: skip
    kept = _lines(out)
    assert [r.get("id") or (r["device"], r["ts"] - START) for r in kept] == [
        "c-fleet", "c-h1", ("d1", 20.0), ("d1", 30.0), ("d1", 40.0)
    ]  # fmt: skip
    one, two = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    for path, salt in ((one, "x"), (two, "y")):
        assert main(["cut", str(rec), "--out", str(path), "--anonymize", "--salt", salt]) == 0
    a, b = _lines(one), _lines(two)
    hosts = {r["host"] for r in a if "host" in r}
    assert len(hosts) == 2
    assert hosts.isdisjoint(r["host"] for r in b if "host" in r)
    model_change = next(r for r in a if r.get("id") == "c-h1")
    assert model_change["scope"]["host"] in hosts
    assert model_change["from"] == next(r["model"] for r in a if "model" in r)
    again = tmp_path / "3.jsonl"
    assert main(["cut", str(rec), "--out", str(again), "--anonymize", "--salt", "x"]) == 0
    assert again.read_bytes() == one.read_bytes()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--salt", "x"], "--salt needs --anonymize"),
        (["--from", "10m", "--to", "5m"], "--from (10m) is after --to (5m)"),
        (["--to", "soon"], "--to: bad duration 'soon'"),
        (["--from", "2025-01-01T00:00:00"], "--from: '2025-01-01T00:00:00' needs a zone"),
    ],
)
def test_misuse_is_one_line_and_exit_2(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    extra: list[str], message: str,
) -> None:  # fmt: skip
    """Bad flags print one line naming the flag and exit 2; nothing is written."""
    out = tmp_path / "o.jsonl"
    assert main(["cut", str(recording), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message in err
    assert not out.exists()


def test_misuse_of_paths(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing recording, an unknown suffix, or cutting a file onto itself."""
    for argv, message in (
        ([str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o.jsonl")], "recording not found"),
        ([str(recording), "--out", str(tmp_path / "o.txt")], "--out must end in .jsonl"),
        ([str(recording), "--out", str(recording)], "must not be the recording being cut"),
    ):
        assert main(["cut", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err
        assert err.count("\n") == 1
