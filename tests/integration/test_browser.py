"""The report and the live pages in a real headless browser: what renders, what it fetches.

Each scenario keeps one full-page screenshot under the test's tmp dir (its path printed:
`pytest -s` shows it).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from browser_helpers import Browser, Loaded, browser, chromium_or_skip
from factories import fleet
from prometheus_client import CollectorRegistry

from monitor.cli import main
from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.daemon.http import HttpServer
from monitor.daemon.live import LivePages
from monitor.report.series import SeriesKeeper
from sim.recording import write_recording
from sim.run import simulate

pytestmark = pytest.mark.integration

_RENDERED = """(() => {
  const plots = [...document.querySelectorAll('svg.plot')];
  return {
    sections: document.querySelectorAll('section.incident').length,
    plots: plots.length,
    drawn: plots.filter(p => p.getBoundingClientRect().width > 300
                        && p.querySelector('polyline')).length,
    sideways: document.documentElement.scrollWidth > window.innerWidth,
    rows: document.querySelectorAll('tbody tr').length,
  };
})()"""


async def _check(b: Browser, url: str, shot: Path) -> tuple[Loaded, dict[str, object]]:
    """Load `url`: only it was requested, nothing went wrong, and here is what rendered."""
    loaded = await b.load(url)
    rendered = await b.evaluate(_RENDERED)
    print(f"screenshot: {await b.screenshot(shot)}")
    assert loaded.requests == [url], f"network requests besides the page: {loaded.requests}"
    assert loaded.errors == [], loaded.errors
    assert rendered["sideways"] is False, f"scrolls sideways ({shot})"
    return loaded, rendered


def test_report_renders_offline(tmp_path: Path) -> None:
    """A scenario's report opens from disk: one section and one drawn plot per incident, no
    console errors, no request but the file itself, no sideways scrolling (at 1000 and
    700 px)."""
    binary = chromium_or_skip()
    rec = tmp_path / "pool_regression.jsonl.gz"
    write_recording(simulate("pool_regression", devices=64, duration_s=1200.0, seed=5), rec)
    alerts, out = tmp_path / "alerts.jsonl", tmp_path / "report.html"
    assert main(["replay", str(rec), "--alerts-out", str(alerts)]) == 0
    assert main(["report", str(rec), "--alerts", str(alerts), "--out", str(out)]) == 0
    ids = {line.split('"id":"', 1)[1].split('"', 1)[0] for line in alerts.read_text().split("\n")
           if line}  # fmt: skip
    for width in (1000, 700):

        async def look(width: int = width) -> dict[str, object]:
            async with browser(binary, tmp_path / f"profile-{width}", width) as b:
                return (await _check(b, out.as_uri(), tmp_path / f"report-{width}.png"))[1]

        # The commands above run their own event loops: this test has none of its own.
        r = asyncio.run(look())
        assert r["sections"] == len(ids) >= 1
        assert r["drawn"] == len(ids)


async def test_live_pages_render(tmp_path: Path) -> None:
    """The daemon's /alerts lists the incident and /alerts/<id> draws it, fetching nothing
    else (no favicon either)."""
    binary = chromium_or_skip()
    pipeline = Pipeline(Settings())
    keeper = SeriesKeeper()
    pipeline.observer = keeper.observe
    pages = LivePages(pipeline, keeper)
    for batch in fleet(80, regress_at=40, change_at=39):
        pages.sent(pipeline.process(batch).alerts)
    ids = list(dict.fromkeys(v.alert.id for v in pages._views.values()))
    assert ids
    server = HttpServer(CollectorRegistry(), lambda: True, pages=pages)
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with browser(binary, tmp_path / "profile") as b:
            _, listed = await _check(b, f"{base}/alerts", tmp_path / "alerts.png")
            assert listed["rows"] == len(ids)
            _, page = await _check(b, f"{base}/alerts/{ids[0]}", tmp_path / "incident.png")
    finally:
        await server.close()
    assert page["sections"] == 1
    assert page["drawn"] == 1
