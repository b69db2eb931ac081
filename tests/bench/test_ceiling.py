"""bench/ceiling.py: one small run through the real broker reports every row and the ceiling."""

from __future__ import annotations

import asyncio

import pytest

from bench.ceiling import ROWS, measure


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_small_run_reports_every_row_and_the_ceiling_from_them() -> None:
    """Every record is consumed (the loop ends) and parsed, and the ceiling is
    1 / (consume + typed parse) of the reported rows."""
    r = asyncio.run(measure(devices=40, windows=2, repeat=1))
    assert r["records"] == 80
    assert sorted(r["us_per_record"]) == sorted(ROWS)
    assert all(v > 0 for v in r["us_per_record"].values())
    us = r["us_per_record"]
    assert r["ceiling_records_per_s"] == pytest.approx(
        1e6 / (us["consume"] + us["parse_typed"]), rel=1e-3
    )
