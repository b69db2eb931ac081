"""bench.diagnose: seed lists and the pooled keys its --json carries."""

from __future__ import annotations

import argparse

import pytest

from bench.diagnose import ScenarioResult, seed_list, summarize


def test_seed_lists() -> None:
    """Ranges, lists and mixes; anything else is an argparse error."""
    assert seed_list("1-5") == [1, 2, 3, 4, 5]
    assert seed_list("1,3,7") == [1, 3, 7]
    assert seed_list("1-3,9") == [1, 2, 3, 9]
    for bad in ("", "a-b", "1-", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_list(bad)


def test_pooled_keys_and_rates() -> None:
    """The issue's keys are there; false pages per hour pool over the runs' event time."""
    runs = [
        ScenarioResult("a", 2, seed=1, hours=0.5, found=2, stage_ok=2, rollback_ok=1),
        ScenarioResult("b", 0, seed=1, hours=1.5, false_incidents=2, false_pages=1),
    ]
    got = summarize(runs)
    for key in ("incident_recall", "stage_accuracy", "rollback_accuracy", "duplicate_alerts",
                "false_incidents", "false_pages_per_hour", "false_tickets_per_hour"):  # fmt: skip
        assert key in got
    assert got["incident_recall"] == 1.0
    assert got["rollback_accuracy"] == 0.5
    assert got["false_pages_per_hour"] == 0.5
    assert got["false_incidents"] == 2
