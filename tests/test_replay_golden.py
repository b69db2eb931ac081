"""Regression guard: the scenario pack replays to the committed alerts and checkpoint bytes.

A refactor must not change what the monitor says or what it stores. If a change means
to alter judgement, regenerate with `python -m tests.golden_replay --write` and say why.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from tests.golden_replay import GOLDEN, PACK, replay_pinned

_EXPECTED = json.loads(GOLDEN.read_text())


@functools.cache
def _replayed() -> dict[str, Any]:
    return replay_pinned()


def test_golden_file_covers_the_pack() -> None:
    """Every scenario replayed here has a golden entry, and some of them page."""
    assert sorted(_EXPECTED) == sorted(PACK)
    assert sum(len(v["alerts"]) for v in _EXPECTED.values()) > 10


@pytest.mark.parametrize("name", PACK)
def test_replay_is_byte_identical_to_golden(name: str) -> None:
    """Alerts (as encoded for the sinks) and detector/load-model checkpoints match."""
    got = _replayed()[name]
    want = _EXPECTED[name]
    assert got["alerts"] == want["alerts"]
    assert got["state"] == want["state"]
