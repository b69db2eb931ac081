"""The pytest plugin, in scratch projects run by pytester: spec files and the fixture."""

from __future__ import annotations

import os
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SPEC = """\
input: {{recording: rec.jsonl}}
alerts:
  - pool: train-a
    severity: {severity}
    rollback: chg-39856
"""

TEST_FIXTURE = """\
import pytest

def test_pages(flopwatch_replay):
    replay = flopwatch_replay("rec.jsonl")
    inc = replay.assert_pages(pool="train-a", layers=["attention"], rollback="chg-39856",
                              onset={"change": "chg-39856", "within": 6})
    assert inc.state == "open"
    replay.assert_quiet(pool="train-b")
    replay.assert_quiet(to={"change": "chg-39856"})
    with pytest.raises(AssertionError, match="nearest of 0|paged nothing"):
        replay.assert_pages(pool="train-a")  # claimed above: no second incident
    with pytest.raises(TypeError, match="severty: unknown field"):
        replay.assert_pages(severty="page")

def test_scenario(flopwatch_replay):
    replay = flopwatch_replay(scenario="pool_regression", devices=16, duration="3m",
                              config={"detector": {"h": 20}})
    assert replay.alerts == []
    assert replay.replayed.lines == 16 * 18 + 1  # every window, and the change event
    replay.assert_quiet()
"""


@pytest.fixture(autouse=True)
def _entry_point(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scratch project finds the plugin by its `pytest11` entry point only, as a user's
    would. An install has it; an environment installed before it existed gets the entry
    point pyproject.toml declares, as package metadata on the subprocess's path."""
    if entry_points(group="pytest11", name="flopwatch"):
        return
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    dist = tmp_path_factory.mktemp("meta") / "flopwatch_entry-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flopwatch-entry\nVersion: 0\n")
    lines = [f"{k} = {v}" for k, v in declared["pytest11"].items()]
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(lines) + "\n")
    path = os.pathsep.join(p for p in (str(dist.parent), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """pool_regression on 48 devices as recording bytes, written once."""
    from sim.recording import write_recording  # noqa: PLC0415
    from sim.run import simulate  # noqa: PLC0415

    path = tmp_path_factory.mktemp("rec") / "rec.jsonl"
    write_recording(simulate("pool_regression", devices=48, seed=11), path)
    return path.read_bytes()


def test_spec_files_are_collected_and_pass_or_fail(
    pytester: pytest.Pytester, recording: bytes
) -> None:
    """Plain `pytest` in a scratch project collects `*.flopwatch.yaml` files; a met spec
    passes, a wrong one fails with the diff that names the field and the nearest alert."""
    (pytester.path / "rec.jsonl").write_bytes(recording)
    pytester.makefile(".flopwatch.yaml", good=SPEC.format(severity="page"))
    pytester.makefile(".flopwatch.yaml", wrong=SPEC.format(severity="ticket"))
    pytester.makefile(".yaml", other="not: a spec")  # only *.flopwatch.yaml is collected
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*good.flopwatch.yaml::good PASSED*",
        "*wrong.flopwatch.yaml::wrong FAILED*",
        "*✗ severity*ticket*page*",
    ])  # fmt: skip
    assert "Traceback" not in result.stdout.str()


def test_a_bad_spec_fails_its_item_in_one_line(pytester: pytest.Pytester) -> None:
    """A spec that does not validate fails as an item, with the field named."""
    pytester.makefile(".flopwatch.yaml", bad="input: {scenario: pool_regression}\nnope: 1\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*bad.flopwatch.yaml: nope: unknown field*"])


def test_the_fixture_replays_and_asserts(pytester: pytest.Pytester, recording: bytes) -> None:
    """`flopwatch_replay` replays a recording next to the test file, or a scenario."""
    (pytester.path / "rec.jsonl").write_bytes(recording)
    pytester.makepyfile(test_replay=TEST_FIXTURE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
