"""bench.diagnose: seed lists and the pooled keys its --json carries."""

from __future__ import annotations

import argparse

import msgspec
import pytest
from factories import fleet

from bench.diagnose import HOLDOUT, ScenarioResult, score, seed_list, seed_sets, summarize
from monitor.config import Settings
from monitor.core.pipeline import Pipeline


def test_seed_lists() -> None:
    """Ranges, lists and mixes; anything else is an argparse error."""
    assert seed_list("1-5") == [1, 2, 3, 4, 5]
    assert seed_list("1,3,7") == [1, 3, 7]
    assert seed_list("1-3,9") == [1, 2, 3, 9]
    for bad in ("", "a-b", "1-", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_list(bad)


def test_holdout_seeds_are_reported_apart_wherever_they_were_asked_for() -> None:
    """A holdout seed in --seeds is a holdout run, never a tuning one."""
    assert seed_sets([1, 2], holdout=False) == {"tuning": [1, 2]}
    assert seed_sets([1, 2], holdout=True) == {"tuning": [1, 2], "holdout": HOLDOUT}
    assert seed_sets([99, 101, 102, 106], holdout=False) == {
        "tuning": [99, 106], "holdout": [101, 102]}  # fmt: skip
    assert seed_sets([103], holdout=False) == {"holdout": [103]}
    assert seed_sets([103], holdout=True) == {"holdout": HOLDOUT}


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


def test_page_recall_counts_only_incidents_that_woke_oncall() -> None:
    """A labelled incident found at ticket severity is found, not paged, and says so."""
    p = Pipeline(Settings())
    alerts = [a for b in fleet(80, regress_at=40, change_at=39) for a in p.process(b).alerts]
    firing = [a for a in alerts if a.status == "firing"]
    assert firing
    assert firing[0].severity == "page"
    first = firing[0]
    labels = {
        "scenario": "x", "window_s": 10.0, "start_ts": first.onset_ts - 400.0, "changes": [],
        "incidents": [{"id": "inc-1", "onset_ts": first.onset_ts, "first_failing_stage": "x",
                       "change_id": None, "scope": {"pool": first.scope.pool, "level": "pool"}}],
    }  # fmt: skip
    paged = score(labels, alerts, tolerance=6.0)
    assert (paged.found, paged.paged, paged.unpaged) == (1, 1, [])
    tickets = [msgspec.structs.replace(a, severity="ticket") for a in alerts]
    quiet = score(labels, tickets, tolerance=6.0)
    assert (quiet.found, quiet.paged) == (1, 0)
    assert quiet.unpaged
    assert quiet.unpaged[0].startswith("inc-1")
    assert summarize([paged, quiet])["page_recall"] == 0.5
