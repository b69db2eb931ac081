"""The TCPD scoring in bench/tcpd.py on hand-checked cases."""

from __future__ import annotations

import pytest

from bench.tcpd import cover, f1, segments, true_positives


def test_true_positives_match_each_prediction_once() -> None:
    """Two annotated changes near one prediction: it counts for one of them only."""
    assert true_positives({10, 13}, {12}) == {10}
    assert true_positives({10, 13}, {12, 14}) == {10, 13}
    assert true_positives({10, 30}, {12, 40}) == {10}
    assert true_positives({10}, {16}) == set()  # beyond the 5-sample margin


@pytest.mark.parametrize(
    ("annotations", "found", "expected"),
    [
        ([[10]], [10], 1.0),
        # The series start counts for both sides: no prediction is precision 1, recall 1/2.
        ([[10]], [], 2 * 0.5 / 1.5),
        # Two annotators; 12 is within 5 of 10, not of 20: P 1, R (1 + 1/2) / 2.
        ([[10], [20]], [12], 2 * 0.75 / 1.75),
        # A false alarm halves precision.
        ([[10]], [10, 50], 2 * (2 / 3) / (1 + 2 / 3)),
    ],
)
def test_f1(annotations: list[list[int]], found: list[int], expected: float) -> None:
    """F1 against several annotators with the start of the series counted."""
    assert f1(annotations, found) == pytest.approx(expected)


def test_cover() -> None:
    """Covering: exact segmentation 1; one segment for two halves 0.5."""
    assert segments([50], 100) == [range(50), range(50, 100)]
    assert cover([[50]], [50], 100) == pytest.approx(1.0)
    assert cover([[50]], [], 100) == pytest.approx(0.5)
    assert cover([[50], []], [], 100) == pytest.approx(0.75)


def test_binseg_finds_two_steps_and_nothing_in_noise() -> None:
    """The bench's binseg: two clear steps found exactly; pure noise gives none."""
    import numpy as np  # noqa: PLC0415

    from bench.tcpd import binseg  # noqa: PLC0415

    x = np.random.default_rng(0).standard_normal(200)
    assert binseg(list(x)) == []
    x[60:] += 5.0
    x[140:] -= 8.0
    assert binseg(list(x)) == [60, 140]


def test_halves_split_alphabetically() -> None:
    """Half A takes even positions in alphabetical order, B odd ones; the pool all."""
    from bench.tcpd import halves  # noqa: PLC0415

    assert halves(["d", "a", "c", "b", "e"]) == {
        "A": ["a", "c", "e"], "B": ["b", "d"], "pool": ["a", "b", "c", "d", "e"],
    }  # fmt: skip
