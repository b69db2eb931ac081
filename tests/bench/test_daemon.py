"""bench/daemon.py: its arguments, its regression schedule, and one small run end to end."""

from __future__ import annotations

import asyncio

import pytest

from bench.daemon import REGRESS_EVERY, REGRESS_FROM, bench, parse_args, regressed_pools
from monitor.config import AlertSettings


@pytest.mark.parametrize(
    "argv",
    [["--devices", "0"], ["--windows", "2"], ["--load", "1.5"], ["--latency-devices", "-1"]],
)
def test_bad_arguments_exit_2_in_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]
                                          ) -> None:  # fmt: skip
    """Misuse prints one line on stderr and exits 2."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.daemon: error:")
    assert err.count("\n") == 1


def test_each_pool_regresses_alone_and_apart() -> None:
    """One pool at a time, each regression's onset more than a grouping window after the last
    one's, so the correlator cannot merge them into one incident."""
    spans: dict[int, list[int]] = {}
    for i in range(REGRESS_FROM + 3 * REGRESS_EVERY):
        bad = regressed_pools(i, 3)
        assert len(bad) <= 1
        for k in bad:
            spans.setdefault(k, []).append(i)
    assert sorted(spans) == [0, 1, 2]
    window = AlertSettings().group_window_s / 10.0
    for k in (1, 2):
        assert spans[k][0] - spans[k - 1][0] > window
        assert spans[k][0] > spans[k - 1][-1]
        assert spans[k] == list(range(spans[k][0], spans[k][-1] + 1))


@pytest.mark.slow  # tens of seconds: make test-slow and CI run it
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_small_run_reports_every_key() -> None:
    """A small fleet through `flopwatch run` (on a broker of its own): throughput, memory,
    catch-up, and the alerts of both regressed pools with their latencies."""
    live = str(REGRESS_FROM + 2 * REGRESS_EVERY)
    args = parse_args(["--devices", "3000", "--windows", "4", "--latency-devices", "24",
                       "--pools", "2", "--live-windows", live])  # fmt: skip
    result = asyncio.run(bench(args))
    for key in ("e2e_records_per_s", "rss_bytes_per_stream", "catch_up_speedup",
                "alert_latency_p50_s", "alert_latency_p99_s"):  # fmt: skip
        assert result[key] > 0, key
    assert result["pools_paged"] == result["pools_regressed"] == ["pool-0", "pool-1"]
    assert result["alert_latency_samples"] == result["alert_records"] >= 2
