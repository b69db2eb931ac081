"""`flopwatch test`: spec validation, judging, the failure diff, exit codes and JUnit XML."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from monitor.cli import main
from monitor.config import Settings
from monitor.errors import UsageError
from monitor.sinks.jsonl import alert_line
from monitor.spec.junit import junit_xml
from monitor.spec.runner import Replayed, SpecResult, judge, prepare, replay_prepared
from monitor.spec.schema import json_schema, parse_spec
from sim.recording import write_recording
from sim.run import simulate
from tests.monitor.spec.junit_shape import check_junit

POOL = "input: {scenario: pool_regression, seed: 11, devices: 48}\n"
GOOD = (
    POOL
    + """
alerts:
  - pool: train-a
    metric: mfu
    layers: [attention]
    severity: page
    first_failing_stage: lowering
    rollback: chg-39856
    onset: {change: chg-39856, within: 6}
    state: open
quiet:
  - to: {change: chg-39856}
"""
)
# One field wrong (severity); everything else as GOOD.
WRONG = GOOD.replace("severity: page", "severity: ticket")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    """pool_regression on 48 devices, replayed once for every judgement below."""
    path = tmp_path_factory.mktemp("spec") / "p.flopwatch.yaml"
    path.write_text(POOL)
    return asyncio.run(replay_prepared(prepare(path, Settings())))


def _write(tmp_path: Path, text: str, name: str = "s.flopwatch.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_met_spec_passes(replayed: Replayed) -> None:
    """Every expectation of the pool_regression spec holds; the incident is claimed."""
    outcomes = judge(parse_spec(GOOD), replayed)
    assert [o.ok for o in outcomes] == [True, True, True]
    assert outcomes[-1].name == "no unexpected incident"


def test_a_wrong_expectation_names_the_field_and_the_nearest_alert(replayed: Replayed) -> None:
    """The diff says which field differs, what was expected, what the nearest alert had."""
    outcomes = judge(parse_spec(WRONG), replayed)
    bad = [o for o in outcomes if not o.ok]
    # The expectation fails, and the incident it would have claimed becomes unexpected.
    assert [o.name.split()[0] for o in bad] == ["alerts[0]", "no"]
    detail = bad[0].detail
    incident = replayed.alerts[0].id
    assert f"nearest of 1: {incident} page pool train-a [attention] mfu" in detail
    rows = {line.split()[1]: line for line in detail.splitlines()[1:]}
    assert rows["severity"].split() == ["✗", "severity", "ticket", "page"]
    assert rows["pool"].split()[0] == "✓"
    assert rows["onset"].startswith("    ✓ onset")


def test_onset_window_quiet_interval_and_state_are_checked(replayed: Replayed) -> None:
    """An onset anchored too early, a quiet interval over the detection, a wrong state."""
    spec = parse_spec(
        POOL
        + """
alerts:
  - pool: train-a
    onset: {at: 2m, within: 3}
  - pool: train-a
    state: resolved
quiet:
  - from: {change: chg-39856}
    severity: page
  - pool: train-b
unexpected: allow
"""
    )
    onset, state, quiet, quiet_b = judge(spec, replayed)
    assert not onset.ok
    assert "✗ onset  within 3 windows of +2m00s" in onset.detail
    assert not state.ok
    assert "✗ state" in state.detail
    assert "resolved  open" in state.detail
    assert not quiet.ok
    assert "1 alert record fired" in quiet.detail
    assert quiet_b.ok


def test_unknown_change_fails_the_expectation(replayed: Replayed) -> None:
    """A change id the input does not hold fails that expectation, saying so."""
    spec = parse_spec(POOL + "alerts: [{onset: {change: chg-nope}}]\nunexpected: allow\n")
    (outcome,) = judge(spec, replayed)
    assert not outcome.ok
    assert outcome.detail == "change 'chg-nope' is not in the input"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (POOL + "alerts: [{severty: page}]", "alerts[0].severty: unknown field"),
        (POOL + "alerts: [{severity: loud}]", "alerts[0].severity: invalid enum value 'loud'"),
        (POOL + "quiet: [{from: 5q}]", "quiet[0].from: bad duration '5q'"),
        ("alerts: []", "input: missing required field"),
        ("input: {scenario: a, recording: b}", "input: give exactly one of"),
        (POOL + "alerts: [{onset: {within: 2}}]", "alerts[0].onset: give exactly one of"),
        (POOL + "alerts: [{onset: {at: '2025-01-01T00:00:00'}}]", "needs a zone"),
        ("input: [1", "line 1: invalid YAML"),
        ("- 1", "expected a mapping"),
    ],
)
def test_bad_specs_are_one_line_naming_the_field(text: str, message: str) -> None:
    """Every misuse is a UsageError whose one line names the field."""
    with pytest.raises(UsageError) as exc:
        parse_spec(text, "s.yaml")
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_config_overrides_apply_and_are_checked(tmp_path: Path) -> None:
    """`config:` lands on Settings (nested mappings merge); a bad key is exit-2 misuse."""
    prep = prepare(_write(tmp_path, POOL + "config: {detector: {h: 13}, alerts: {min_devices: 3}}"),
                   Settings())  # fmt: skip
    assert prep.settings.detector.h == 13
    assert prep.settings.alerts.min_devices == 3
    assert prep.settings.detector.kind == Settings().detector.kind
    with pytest.raises(UsageError, match=r"config\.detector\.hh: Extra inputs"):
        prepare(_write(tmp_path, POOL + "config: {detector: {hh: 13}}"), Settings())
    with pytest.raises(UsageError, match=r"input\.scenario: unknown scenario 'nope'"):
        prepare(_write(tmp_path, "input: {scenario: nope}"), Settings())
    with pytest.raises(UsageError, match=r"input\.recording: not found"):
        prepare(_write(tmp_path, "input: {recording: gone.jsonl}"), Settings())


def test_cli_exit_codes_and_junit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0 when met, 1 when not (naming the expectation), 2 for misuse before any replay."""
    good, wrong = _write(tmp_path, GOOD, "good.flopwatch.yaml"), _write(tmp_path, WRONG, "w.yaml")
    junit = tmp_path / "junit.xml"
    assert main(["test", str(good), str(wrong), "--junit", str(junit)]) == 1
    out = capsys.readouterr().out
    assert f"PASS {good}" in out
    assert f"FAIL {wrong}" in out
    assert "alerts[0] metric=mfu layers=attention pool=train-a" in out
    suites = check_junit(junit.read_bytes())
    assert [s.attrib["failures"] for s in suites] == ["0", "2"]
    failure = suites[1].find("testcase/failure")
    assert failure is not None
    assert "✗ severity" in (failure.text or "")

    bad = _write(tmp_path, POOL + "alerts: [{severty: page}]", "bad.yaml")
    assert main(["test", str(good), str(bad)]) == 2
    err = capsys.readouterr()
    assert err.out == ""  # nothing ran
    assert err.err == f"flopwatch test: error: {bad}: alerts[0].severty: unknown field\n"
    assert main(["test"]) == 2
    assert main(["test", str(tmp_path / "none.yaml")]) == 2


def test_schema_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """`--schema` prints the JSON Schema the specs are checked against."""
    assert main(["test", "--schema"]) == 0
    schema = msgspec.json.decode(capsys.readouterr().out)
    assert schema == msgspec.json.decode(msgspec.json.encode(json_schema()))
    assert "ExpectAlert" in schema["$defs"]


def test_spec_replay_is_flopwatch_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         replayed: Replayed) -> None:  # fmt: skip
    """A scenario spec judges exactly the alerts `flopwatch replay` prints for that
    scenario's recording, byte for byte."""
    rec = tmp_path / "pool.jsonl.zst"
    write_recording(simulate("pool_regression", devices=48, seed=11), rec)
    out = tmp_path / "alerts.jsonl"
    assert main(["replay", str(rec), "--alerts-out", str(out)]) == 0
    assert out.read_bytes() == b"".join(alert_line(a) for a in replayed.alerts)
    assert replayed.alerts
    # And a spec over the recording file itself judges the same.
    spec = _write(tmp_path, f"input: {{recording: {rec.name}}}\n" + GOOD.split("\n", 1)[1])
    prep = prepare(spec, Settings())
    result = SpecResult(spec, prep.spec, asyncio.run(replay_prepared(prep)), [])
    assert result.replayed.alerts == replayed.alerts
    assert result.replayed.start_ts == replayed.start_ts
    assert result.replayed.changes == replayed.changes
    assert all(o.ok for o in judge(prep.spec, result.replayed))
    capsys.readouterr()


def test_junit_of_no_failures_is_valid(replayed: Replayed) -> None:
    """The document for passing specs has the same shape."""
    spec = parse_spec(GOOD)
    res = SpecResult(Path("good.flopwatch.yaml"), spec, replayed, judge(spec, replayed))
    (suite,) = check_junit(junit_xml([res]))
    assert suite.attrib["tests"] == "3"
    assert suite.attrib["failures"] == "0"
