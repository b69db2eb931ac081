"""`flopwatch report`: one self-contained HTML page per recording, one section per incident."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.progress import Progress
from monitor.report.render import report_html
from sim.recording import write_recording
from sim.run import simulate

# Anything a browser would fetch: src/srcset/poster, a <link>'s href, CSS url() and @import.
_FETCHED = re.compile(
    r"""(?:\b(?:src|srcset|poster|data)\s*=\s*["']?(?!data:)[^"'\s>]+)"""
    r"""|<link\b[^>]*\bhref\s*=\s*["'](?!data:)|url\(\s*["']?(?!data:)|@import|<script\b[^>]*src""",
    re.IGNORECASE,
)


def fetched_resources(html: str) -> list[str]:
    """What in `html` would make a browser load something."""
    return [m.group(0) for m in _FETCHED.finditer(html)]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small pool_regression run (one kernel_lib change, one paging incident)."""
    path = tmp_path_factory.mktemp("rec") / "pool_regression.jsonl.gz"
    write_recording(simulate("pool_regression", devices=64, duration_s=1200.0, seed=5), path)
    return path


@pytest.fixture(scope="module")
def alert_ids(recording: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The incident ids `flopwatch replay` pages for the recording, in order."""
    out = tmp_path_factory.mktemp("alerts") / "alerts.jsonl"
    assert main(["replay", str(recording), "--alerts-out", str(out)]) == 0
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    return list(dict.fromkeys(ids))


def test_report_has_one_section_per_incident_and_fetches_nothing(
    recording: Path, alert_ids: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replayed in-process: a section (with its SVG plot) per alert id, the change on the
    timeline, and no reference that a browser would fetch."""
    out = tmp_path / "report.html"
    assert main(["report", str(recording), "--out", str(out)]) == 0
    html = out.read_text()
    assert alert_ids
    sections = re.findall(r'<section class="incident" id="([^"]+)">', html)
    assert sections == alert_ids
    for part in html.split('<section class="incident"')[1:]:
        assert '<svg class="plot"' in part
        assert "<polyline" in part  # a measured line, not only marks
        assert "first failing" in part
        assert '<i class="dev hit"' in part
    assert "chg-" in html.split('<section class="incident"')[0]  # on the timeline
    assert fetched_resources(html) == []
    assert "http://" not in html
    assert "https://" not in html
    assert "<script" not in html
    err = capsys.readouterr().err
    assert f"{len(alert_ids)} incidents" in err


def test_report_from_an_alerts_file_matches(
    recording: Path, alert_ids: list[str], tmp_path: Path
) -> None:
    """With --alerts the recording is not replayed for alerts; the same incidents show."""
    alerts = tmp_path / "alerts.jsonl"
    assert main(["replay", str(recording), "--alerts-out", str(alerts)]) == 0
    out = tmp_path / "r.html"
    assert main(["report", str(recording), "--alerts", str(alerts), "--out", str(out)]) == 0
    assert re.findall(r'<section class="incident" id="([^"]+)">', out.read_text()) == alert_ids


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", "x.txt"], "--out must end in .html"),
        (["--alerts", "missing.jsonl", "--out", "r.html"], "alerts file not found"),
    ],
)
def test_misuse_is_one_line_and_exit_2(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
    message: str,
) -> None:  # fmt: skip
    """Bad arguments: one line on stderr naming the problem, exit code 2."""
    args = [a if a.startswith("--") else str(tmp_path / a) for a in extra]
    assert main(["report", str(recording), *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_missing_recording_and_bad_alerts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing recording, or an alerts file that holds no alert records, is misuse."""
    assert main(["report", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "r.html")]) == 2
    assert "recording not found" in capsys.readouterr().err
    rec = tmp_path / "r.jsonl"
    rec.write_text("")
    bad = tmp_path / "a.jsonl"
    bad.write_text('{"v": 1}\n')
    assert main(["report", str(rec), "--alerts", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert f"{bad}:1: not an alert record" in capsys.readouterr().err


def test_empty_report_says_so() -> None:
    """No incident: the page says so rather than showing an empty timeline only."""
    html = report_html([], [], "empty")
    assert "No incident in this recording." in html
    assert fetched_resources(html) == []


class _Tty:
    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


def test_progress_draws_on_a_terminal_only() -> None:
    """On a TTY: bar, count, rate and ETA, cleared at the end; elsewhere: not a byte."""
    for tty in (True, False):
        out = _Tty(tty)
        with Progress("replay", 1000, "lines", stream=out, interval_s=0) as bar:
            bar.update(250, 5000)
        if not tty:
            assert out.text == ""
            continue
        assert re.search(r"replay \[#{6}\.{18}\]\s+25% 5,000 lines [\d,]+/s ETA \d+:\d\d", out.text)
        assert out.text.endswith("\r\x1b[K")
