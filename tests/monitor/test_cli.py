"""The `flopwatch` command: misuse is one line on stderr and exit 2; replay is deterministic."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from factories import fleet

from monitor.cli import main


def _flopwatch(*args: str, stdin: str | None = None, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "monitor", *args], capture_output=True, text=True, input=stdin,
        timeout=120, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["replay", "/nonexistent/rec.jsonl"], "recording not found"),
        (["replay"], "the following arguments are required: file"),
        (["frobnicate"], "invalid choice"),
        (["replay", "x.jsonl", "--bogus"], "unrecognized arguments"),
        (["up", "--scenario", "no_such_scenario"], "unknown scenario"),
        (["up", "--speed", "slow"], "bad speed"),
        (["up", "--duration", "0s"], "duration must be > 0"),
        (["record", "--out", "x.txt"], "error"),
        (["config", "--config", "/nonexistent.toml"], "config file not found"),
        (["run"], "no Kafka configured"),
        # `detect` stops on a bad --param or --kind before it reads stdin.
        (["detect", "--param", "h"], "invalid parameter 'h' (use NAME=NUMBER)"),
        (["detect", "--param", "h=tall"], "invalid parameter 'h=tall'"),
        (["detect", "--param", "bogus=1"], "unknown detector.params ['bogus'] for kind 'bank'"),
        (["detect", "--param", "clip=-1"], "h, clip and step_cap must be > 0"),
        (["detect", "--kind", "adwin", "--param", "clip=2"], "unknown detector.params ['clip']"),
        (["detect", "--kind", "magic"], "kind: Input should be"),
        # Finite mode sizes itself to the series: engine settings are misuse, not ignored.
        (["detect", "--finite", "--param", "h=5"], "--finite takes no --kind or --param"),
        (["detect", "--finite", "--kind", "cusum"], "--finite takes no --kind or --param"),
    ],
)
def test_misuse_is_one_line_exit_2(args: list[str], needle: str, capsys) -> None:
    """Each misuse prints exactly one line on stderr and exits with code 2."""
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err
    assert err.startswith("flopwatch")


def test_bad_config_value_is_one_line(tmp_path: Path, capsys) -> None:
    """A TOML file with an invalid value is rejected in one line naming the field."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("[detector]\nh = -1\n")
    assert main(["config", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "detector.h" in err


def test_config_masks_secrets_and_reads_env(tmp_path: Path) -> None:
    """`flopwatch config` shows env and TOML settings, with secrets masked."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[kafka]\ngroup_id = "from-file"\n[detector]\nh = 9.5\n[detector.params]\nburn_in = 24\n'
    )
    import os  # noqa: PLC0415

    env = {**os.environ, "FLOPWATCH_KAFKA__SASL_PLAIN_PASSWORD": "hunter2",
           "FLOPWATCH_DETECTOR__H": "12"}  # fmt: skip
    out = _flopwatch("config", "--config", str(cfg), env=env)
    assert out.returncode == 0, out.stderr
    assert "hunter2" not in out.stdout
    data = json.loads(out.stdout)
    assert data["kafka"]["sasl_plain_password"] == "**********"
    assert data["kafka"]["group_id"] == "from-file"
    assert data["detector"]["h"] == 12.0  # env wins over file
    assert data["detector"]["params"] == {"burn_in": 24.0}


def test_schema_prints_all_records() -> None:
    """`flopwatch schema` prints valid JSON Schemas for the three records."""
    out = _flopwatch("schema")
    assert out.returncode == 0
    assert set(json.loads(out.stdout)) == {"window_record", "change_event", "alert"}


def _write_recording(path: Path, bad_lines: bool = True) -> None:
    with gzip.open(path, "wb") as f:
        for i, batch in enumerate(fleet(80, regress_at=45, change_at=44)):
            for m in batch:
                f.write(m.value + b"\n")
            if bad_lines and i == 5:
                f.write(b'{"v":1,"ts":"yesterday","window_s":10,"device":"d","layers":[]}\n')
                f.write(b"garbage\n\n")


def test_replay_is_deterministic_and_reports(tmp_path: Path) -> None:
    """Two replays of one recording give byte-identical alert JSONL; the summary counts input."""
    rec = tmp_path / "rec.jsonl.gz"
    _write_recording(rec)
    first = _flopwatch("replay", str(rec))
    second = _flopwatch("replay", str(rec), "--alerts-out", str(tmp_path / "a.jsonl"))
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert first.stdout.encode() == (tmp_path / "a.jsonl").read_bytes()
    alerts = [json.loads(line) for line in first.stdout.splitlines()]
    assert alerts
    assert {a["id"] for a in alerts} == {alerts[0]["id"]}
    assert alerts[0]["suggestion"]["change_id"] == "chg-1"
    summary = first.stderr.strip().splitlines()[-1]
    assert "2560 window records used" in summary
    assert "1 change events" in summary
    assert "2 rejected" in summary


def test_replay_dead_letters_file(tmp_path: Path) -> None:
    """--dead-letters writes each rejected line with its line number and reason."""
    rec = tmp_path / "rec.jsonl.gz"
    _write_recording(rec)
    dl = tmp_path / "dead.jsonl"
    out = _flopwatch("replay", str(rec), "--dead-letters", str(dl), "--alerts-out",
                     str(tmp_path / "a.jsonl"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    dead = [json.loads(line) for line in dl.read_text().splitlines()]
    assert [d["reason"].split(":")[0] for d in dead] == ["ts", "malformed JSON"]
    assert dead[0]["line"] == 6 * 32 + 1  # six windows of 32 devices, then the bad line


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"FLOPWATCH_DETECTOR__PARAMS__BOGUS": "1"}, "detector: unknown detector.params ['bogus']"),
        ({"FLOPWATCH_DETECTOR__KIND": "magic"}, "detector.kind: Input should be"),
        # Values are checked at load too, not when the first batch builds a detector.
        (
            {"FLOPWATCH_DETECTOR__PARAMS__CLIP": "-1"},
            "detector parameters for kind 'bank': h, clip and step_cap must be > 0",
        ),
        ({"FLOPWATCH_DETECTOR__PARAMS__REL_FLOOR": "0"}, "rel_floor >= 1.19e-07 required"),
        ({"FLOPWATCH_ALERTS__POOL_FRACTION": "2"}, "alerts.pool_fraction"),
        (
            {"FLOPWATCH_DETECTOR__MATERIAL_REL": '{"bogus": 0.1}'},
            "unknown metrics in detector.material_rel: ['bogus']",
        ),
        (
            {"FLOPWATCH_DETECTOR__MATERIAL_ABS": '{"mfu": -1}'},
            "detector.material_abs must be >= 0: ['mfu']",
        ),
    ],
)
def test_bad_environment_is_one_line(env: dict[str, str], needle: str, monkeypatch, capsys) -> None:
    """Bad settings from the environment fail at load, in one line naming the setting."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["config"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert needle in err


def test_replay_with_a_bad_engine_value_is_one_line(tmp_path: Path, capsys) -> None:
    """A bad engine parameter stops replay before any record, in one line (was a traceback
    from the first batch)."""
    rec = tmp_path / "r.jsonl"
    rec.write_text("")
    cfg = tmp_path / "c.toml"
    cfg.write_text("[detector.params]\nstep_cap = 0\n")
    assert main(["replay", str(rec), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "step_cap must be > 0" in err


STEPS = "".join(f"{10.0 + (3.0 if 100 <= i < 200 else 0.0) + 0.1 * ((i * 7) % 11 - 5)}\n"
                for i in range(350))  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "expect"),
    [
        ([], {}, "100\n200\n"),
        # The configured threshold applies (it was ignored before 2026-11-30).
        ([], {"FLOPWATCH_DETECTOR__H": "1000"}, ""),
        (["--param", "h=1000"], {}, ""),
        # The command line wins over the environment.
        (["--param", "h=11"], {"FLOPWATCH_DETECTOR__H": "1000"}, "100\n200\n"),
        # Another kind starts from its own defaults: the bank's clip does not follow it.
        (["--kind", "cusum"], {"FLOPWATCH_DETECTOR__PARAMS__YOUTH": "8"}, None),
    ],
)
def test_detect_uses_the_configured_engine(
    args: list[str], env: dict[str, str], expect: str | None, monkeypatch, capsys
) -> None:
    """`flopwatch detect` runs the configured kind, threshold and parameters, then --param."""
    import io  # noqa: PLC0415

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "stdin", io.StringIO(STEPS))
    assert main(["detect", *args]) == 0
    out = capsys.readouterr().out
    if expect is None:
        assert any(abs(int(i) - 100) <= 10 for i in out.split())
    else:
        assert out == expect


def test_detect_finite_prints_onsets_after_the_input_ends(monkeypatch, capsys) -> None:
    """`--finite` on a 60-line history with a step at 30: the onset, nothing on stderr."""
    import io  # noqa: PLC0415

    x = 10.0 + np.random.default_rng(3).standard_normal(60)
    x[30:] += 4.0
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{v}\n" for v in x)))
    assert main(["detect", "--finite"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert [abs(int(i) - 30) <= 2 for i in out.split()] == [True]


def test_detect_finite_bad_line_is_one_line_exit_2() -> None:
    """A bad line in finite mode: one error line, exit 2, and no indices (none are judged
    before the input has ended)."""
    steps = "".join(f"{10 + 5 * (i >= 30)}\n" for i in range(60))
    res = _flopwatch("detect", "--finite", stdin=steps + "1,5\n")
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr == "flopwatch detect: error: line 61: expected a number, got '1,5'\n"


def test_unreachable_kafka_is_one_line_exit_2(monkeypatch, capsys) -> None:
    """`flopwatch run` against a port where no broker listens: one line naming the address,
    exit 2, no traceback and no unclosed-client warnings (filterwarnings=error)."""
    from monitor.daemon.embedded import free_port  # noqa: PLC0415

    where = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS", where)
    monkeypatch.setenv("FLOPWATCH_HTTP_PORT", "0")
    monkeypatch.setenv("FLOPWATCH_CHECKPOINT__KEY", "test-key")
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"cannot start against Kafka at {where}" in err


def test_up_and_sim_share_one_duration_and_speed_grammar() -> None:
    """`up --speed 10x --sim-duration 1d` parses as `sim` does (one parser for both)."""
    from monitor.cli import build_parser  # noqa: PLC0415

    args = build_parser().parse_args(["up", "--speed", "10x", "--sim-duration", "1d"])
    assert (args.speed, args.sim_duration) == (10.0, 86400.0)
    assert build_parser().parse_args(["up", "--speed", "max"]).speed is None


def test_replay_batch_size_zero_is_misuse(tmp_path: Path, capsys) -> None:
    """`--batch-size 0` is refused, not taken as "the default"."""
    rec = tmp_path / "r.jsonl"
    rec.write_text("")
    assert main(["replay", str(rec), "--batch-size", "0"]) == 2
    assert "--batch-size must be >= 1" in capsys.readouterr().err


def test_run_without_a_checkpoint_key_is_refused(monkeypatch, capsys) -> None:
    """Checkpoint authentication is on by default: `run` without a key names the setting
    and the way out in one line, exit 2, before it connects to anything."""
    monkeypatch.setenv("FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.delenv("FLOPWATCH_CHECKPOINT__KEY", raising=False)
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "FLOPWATCH_CHECKPOINT__KEY" in err
    assert "FLOPWATCH_CHECKPOINT__REQUIRE_KEY=false" in err
