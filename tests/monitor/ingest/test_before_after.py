"""A real before/after (issue 22 item 6): two real H100 traces that differ in attention kernel
selection, ingested and spliced into one device's stream (`tests/before_after.py`), page at
stage lowering. `tests/specs/real_before_after.flopwatch.yaml` states the page itself."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.wire import Codec
from tests.before_after import FIXTURE, N_AFTER, N_BEFORE, build


@pytest.fixture(scope="module")
def built() -> bytes:
    return build()


def _replay(path: Path, tmp_path: Path) -> list[dict]:
    out = tmp_path / "alerts.jsonl"
    dead = tmp_path / "dead.jsonl"
    assert main(["replay", str(path), "--alerts-out", str(out), "--dead-letters", str(dead)]) == 0
    assert dead.read_text() == ""
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_the_fixture_is_what_flopwatch_ingest_makes_of_the_two_traces(built: bytes) -> None:
    """Provenance: the checked-in stream is rebuilt byte for byte from the vendored traces."""
    assert FIXTURE.read_bytes() == built
    assert FIXTURE.stat().st_size < 5 * 1024 * 1024


def test_one_device_flash_windows_then_eager_windows_end_to_end() -> None:
    codec = Codec()
    recs = [codec.decode_window(line) for line in FIXTURE.read_bytes().splitlines()]
    assert len(recs) == N_BEFORE + N_AFTER
    assert {(r.device, r.pool, r.model, r.hw, r.dtype) for r in recs} == {
        ("vit-bench/gpu0", "h100-vit", "vit-serving", "h100-sxm", "bf16")
    }
    for prev, rec in itertools.pairwise(recs):
        assert rec.ts == pytest.approx(prev.ts + rec.window_s, abs=1e-6)
    attn = [next(la for la in r.layers if la.type == "attention") for r in recs]
    before, after = attn[:N_BEFORE], attn[N_BEFORE:]
    assert {a.fallback_frac for a in before} == {0.0}  # flash SDPA: fused
    assert all(a.fallback_frac is not None and a.fallback_frac > 0.9 for a in after)  # eager
    assert {a.kernel for a in after} == {"at::native::cunn_SoftMaxForward"}
    assert len({a.kernel for a in before}) == 1
    assert before[0].kernel != after[0].kernel
    # The repeated windows are the adapter's records unchanged, but for `ts`.
    assert len({(r.window_s, tuple(r.layers)) for r in recs[:N_BEFORE]}) == 1
    assert len({(r.window_s, tuple(r.layers)) for r in recs[N_BEFORE:]}) == 1


def test_replayed_it_pages_attention_mfu_at_stage_lowering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in docs/ingest.md: load awareness off (the records carry no load)."""
    monkeypatch.setenv("FLOPWATCH_DETECTOR__LOAD_AWARE", "false")
    alerts = _replay(FIXTURE, tmp_path)
    assert len(alerts) == 1
    a = alerts[0]
    assert (a["status"], a["severity"], a["metric"], a["layers"]) == (
        "firing", "page", "mfu", ["attention"],
    )  # fmt: skip
    assert (a["first_failing_stage"], a["bottleneck"]) == ("lowering", "kernel_selection")
    assert a["before"] == pytest.approx(0.0975, abs=5e-4)
    assert a["after"] == pytest.approx(0.0363, abs=5e-4)
    moved = {(e["stage"], e["indicator"], e["layer"]) for e in a["evidence"]}
    assert {
        ("lowering", "kernel", "attention"),
        ("lowering", "fallback_frac", "attention"),
    } <= moved
    # A profiler trace has no queue, no SLO and no HBM bytes or SRAM hits: named, not implied.
    assert [n["stage"] for n in a["not_judged"]] == ["ingress", "scheduling", "validation"]


def test_with_load_awareness_on_the_noiseless_step_is_absorbed_as_documented(
    tmp_path: Path,
) -> None:
    """docs/ingest.md says the default settings page nothing here: with no load in the
    records the load model's expectation is a running mean, and the ratio it leaves of a
    step with no noise creeps back up, which the detector reads as a transient."""
    assert _replay(FIXTURE, tmp_path) == []


def test_fewer_windows_before_than_the_burn_in_page_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The detector learns a stream from its first 32 windows: a change inside them is
    part of what it learns (docs/ingest.md: 31 windows before is the least that pages)."""
    monkeypatch.setenv("FLOPWATCH_DETECTOR__LOAD_AWARE", "false")
    short = tmp_path / "short.jsonl"
    short.write_bytes(build(n_before=30, n_after=N_AFTER))
    assert _replay(short, tmp_path) == []
    short.write_bytes(build(n_before=31, n_after=N_AFTER))
    assert len(_replay(short, tmp_path)) == 1
