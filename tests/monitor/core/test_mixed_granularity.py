"""Mixed granularity in one pool: per-layer devices (a profiler) beside devices that send
only the whole-device layer `all` (a dcgm-exporter sidecar), issue 22 item 4.

Each device is judged on what it sends; the two kinds never share a pool aggregate; and
an alert names the stages its devices could not show failing, with the missing fields.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np
from factories import PEAK, T0, msg, window

from monitor.config import Settings
from monitor.core import stream_table as st_mod
from monitor.core.coverage import BIT, judged, not_judged, record_masks
from monitor.core.pipeline import Pipeline
from monitor.core.stream_table import COARSE_DEVICE_GROUP, StreamTable
from monitor.core.types import RawMessage
from monitor.hardware import Catalog
from monitor.indicators import DEVICE_METRICS
from monitor.report.render import incident_section, incident_views
from monitor.sinks.alertmanager import to_postable
from monitor.sinks.console import alert_text
from monitor.sinks.pagerduty import _details
from monitor.wire import Alert, Codec

# Each host runs one exporter: a profiler on node-000 and node-002, a dcgm-exporter sidecar
# on node-001 and node-003; four devices each.
LAYERED = [f"node-00{h}/gpu{g}" for h in (0, 2) for g in range(4)]
COARSE = [f"node-00{h}/gpu{g}" for h in (1, 3) for g in range(4)]


def coarse_window(device: str, ts: float, *, mfu: float = 0.38, pool: str = "train-a",
                  **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A record as `flopwatch ingest dcgm` writes it: one layer `all`, FLOPs estimated."""
    rec: dict[str, Any] = {
        "v": 1, "ts": ts, "window_s": 10.0, "device": device,
        "host": device.split("/", maxsplit=1)[0], "pool": pool, "model": "m@1",
        "hw": "h100-sxm", "dtype": "bf16", "source": "dcgm-exporter", "flops_estimated": True,
        "device_stats": {"clock_mhz": 1755.0, "temp_c": 70.0, "power_w": 650.0},
        "layers": [{"type": "all", "busy_s": 9.0, "occupancy": 0.55,
                    "flops": mfu * 10.0 * PEAK, "bytes_hbm": 2.0e13}],
    }  # fmt: skip
    rec.update(extra)
    return rec


def mixed_pool(
    windows: int = 90,
    *,
    regress_at: int | None = None,
    regress: str = "both",  # both | layered | coarse
    change_at: int | None = None,
    coarse_from: int = 0,
    seed: int = 3,
) -> list[list[RawMessage]]:
    """Batches for pool train-a: 8 per-layer devices (`LAYERED`) and 8 `all`-only devices
    (`COARSE`, from window `coarse_from`). A regression at `regress_at` is a kernel
    fallback on the per-layer devices (attention MFU x0.8) and an MFU drop of 25 % on the
    `all`-only ones; `change_at` adds a kernel_lib change event for the pool."""
    rng = np.random.default_rng(seed)
    batches = []
    for w in range(windows):
        ts = T0 + 10.0 * (w + 1)
        batch: list[RawMessage] = []
        if change_at is not None and w == change_at:
            batch.append(msg({"v": 1, "ts": ts - 5.0, "id": "chg-1", "kind": "kernel_lib",
                              "scope": {"pool": "train-a"}, "from": "2.3.0", "to": "2.4.0"},
                             topic="flopwatch.changes"))  # fmt: skip
        bad = regress_at is not None and w >= regress_at
        for d, name in enumerate(LAYERED):
            hit = bad and regress in ("both", "layered")
            noise = 1 + 0.02 * rng.standard_normal()
            rec = window(
                name, ts, mfu=0.45 * noise * (0.8 if hit else 1.0),
                stall=0.3 * (1 + 0.02 * rng.standard_normal()),
                kernel="fa3_fallback" if hit else "fa3", fallback=0.4 if hit else 0.0,
            )  # fmt: skip
            batch.append(msg(rec, partition=d % 4))
        for d, name in enumerate(COARSE):
            if w < coarse_from:
                continue
            hit = bad and regress in ("both", "coarse")
            noise = 1 + 0.02 * rng.standard_normal()
            rec = coarse_window(name, ts, mfu=0.38 * noise * (0.75 if hit else 1))
            batch.append(msg(rec, partition=d % 4))
        batches.append(batch)
    return batches


def _run(batches: list[list[RawMessage]]) -> tuple[Pipeline, list[Alert]]:
    p = Pipeline(Settings())
    out: list[Alert] = []
    for b in batches:
        out.extend(p.process(b).alerts)
    return p, out


def _recs(*dicts: dict[str, Any]):
    c = Codec()
    return [c.decode_window(json.dumps(d).encode()) for d in dicts]


# -- what each kind of device lets the monitor judge ------------------------------------------
def test_each_device_carries_the_fields_of_its_newest_record() -> None:
    """A profiler's device judges lowering, not scheduling (no SRAM, spills or bytes) nor
    ingress and validation (no queue, no SLO); a dcgm device judges execution only."""
    table = StreamTable(Catalog())
    layered = window("a/0", T0)
    coarse = coarse_window("b/0", T0)
    full = window("c/0", T0, ingress={"queue_wait_ms": 3.0}, slo={"lat_p99_ms": 80.0})
    full["layers"][0].update(sram_hit=0.8)
    table.build(_recs(layered, coarse, full))
    masks = {d: table.fields_of(d) for d in ("a/0", "b/0", "c/0")}
    assert all(m is not None for m in masks.values())
    stages = ("ingress", "lowering", "scheduling", "execution", "validation")
    seen = {d: [s for s in stages if judged(s, m or 0)] for d, m in masks.items()}
    assert seen == {
        "a/0": ["lowering", "execution"],
        "b/0": ["execution"],
        "c/0": ["ingress", "lowering", "scheduling", "execution", "validation"],
    }
    # The dcgm device has FLOPs and HBM bytes, but on `all`: no per-layer intensity.
    assert table.fields_of("nobody") is None
    # The newest record wins: the same device now sends only `all`.
    table.build(_recs(coarse_window("a/0", T0 + 10)))
    assert not judged("lowering", table.fields_of("a/0") or 0)


def test_record_masks_or_each_records_own_layers_only() -> None:
    """A batch's masks, vectorised: a record with no layers keeps its device fields alone;
    FLOPs and HBM bytes make arithmetic intensity only on a typed layer."""
    nan = np.nan
    raw = np.array([
        [1.0, 1.0, nan, nan, nan, 5.0, nan, nan, nan, nan],  # rec 0 attention: flops, bytes
        [nan, 1.0, nan, nan, nan, nan, nan, nan, nan, 0.0],  # rec 0 mlp: fallback_frac
        [1.0, 1.0, nan, nan, 0.5, 5.0, nan, nan, nan, nan],  # rec 2 all: flops, bytes
    ])  # fmt: skip
    device = np.full((3, len(DEVICE_METRICS) - 1), nan)
    device[1, 0] = 1755.0  # rec 1: a clock, no layers
    masks = record_masks(raw, np.array([True, True, False]), np.array([0]),
                         np.array([0, 0, 2]), device).tolist()  # fmt: skip
    assert [judged("lowering", m) for m in masks] == [True, False, False]
    assert [judged("scheduling", m) for m in masks] == [True, False, False]
    assert [judged("execution", m) for m in masks] == [True, True, True]
    assert masks[1] == BIT["clock_mhz"]
    assert masks[0] & BIT["layers[].kernel"]
    assert not masks[2] & BIT["layers[].kernel"]


def test_not_judged_counts_the_devices_that_lacked_every_field_of_a_stage() -> None:
    table = StreamTable(Catalog())
    table.build(_recs(window("a/0", T0), coarse_window("b/0", T0), coarse_window("b/1", T0)))
    masks = [table.fields_of(d) or 0 for d in ("a/0", "b/0", "b/1")]
    by_stage = {e.stage: e for e in not_judged(masks)}
    assert list(by_stage) == ["ingress", "lowering", "scheduling", "validation"]
    assert by_stage["lowering"].devices == 2  # the profiler's device saw kernels
    assert by_stage["lowering"].missing == ["layers[].kernel", "layers[].fallback_frac"]
    assert by_stage["scheduling"].devices == 3
    assert "layers[].flops+bytes_hbm per layer type" in by_stage["scheduling"].missing
    assert by_stage["ingress"].devices == 3


def test_field_masks_survive_a_checkpoint_and_older_ones_read_as_unknown() -> None:
    table = StreamTable(Catalog())
    table.build(_recs(window("a/0", T0), coarse_window("b/0", T0)))
    back = StreamTable.restore(table.snapshot(), Catalog())
    assert back.fields_of("a/0") == table.fields_of("a/0")
    assert back.fields_of("b/0") == table.fields_of("b/0")
    # A checkpoint written before masks were kept: unknown, never "no fields".
    state = msgspec.msgpack.decode(table.snapshot(), type=st_mod._TableState)
    old = msgspec.structs.replace(state, device_fields=b"")
    older = StreamTable.restore(msgspec.msgpack.encode(old), Catalog())
    assert older.fields_of("a/0") is None
    older.build(_recs(window("a/0", T0 + 10)))
    assert older.fields_of("a/0") == table.fields_of("a/0")


# -- pool aggregates: the two kinds never mix ---------------------------------------------------
def test_all_only_devices_have_their_own_device_level_pool_aggregate() -> None:
    """Per-layer device MFU (counted FLOPs) and a dcgm estimate are two families: the
    per-layer devices' pool device MFU is theirs alone, and `all` is its own layer group."""
    table = StreamTable(Catalog())
    recs = _recs(window("a/0", T0, mfu=0.5), window("a/1", T0, mfu=0.4),
                 coarse_window("b/0", T0, mfu=0.2), coarse_window("b/1", T0, mfu=0.3))  # fmt: skip
    frame, _ = table.build(recs)
    groups = [table.group_key(g) for g in frame.device_group.tolist()]
    key = ("train-a", "m@1")
    assert groups == [(*key, "", "h100-sxm")] * 2 + [(*key, COARSE_DEVICE_GROUP, "h100-sxm")] * 2
    col = DEVICE_METRICS.index("device_mfu")
    rows, values = frame.pool_device_rows.tolist(), frame.pool_device_values[:, col]
    level = {table.group_key(g)[2]: v for g, v in zip(rows, values, strict=True)}
    per_layer = [(m * 6.0 + 0.6 * 3.0) / 10.0 for m in (0.5, 0.4)]
    assert np.isclose(level[""], np.mean(per_layer))
    assert np.isclose(level[COARSE_DEVICE_GROUP], 0.25)
    layer_groups = {table.group_key(g)[2] for g in frame.pool_layer_rows.tolist()}
    assert layer_groups == {"attention", "mlp", "all"}


def test_a_dcgm_sidecar_joining_the_pool_moves_no_pool_aggregate() -> None:
    """Eight `all`-only devices at a lower (estimated) device MFU join a healthy pool:
    nothing regressed, so no pool aggregate may shift and nothing may page."""
    p, alerts = _run(mixed_pool(100, coarse_from=60))
    assert alerts == []
    moved = {k: n for k, n in p.stats.points.items() if k[0].startswith("pool_") and k[2]}
    assert moved == {}


# -- incidents ------------------------------------------------------------------------------
def test_a_kernel_regression_across_the_mixed_pool_is_attributed_to_lowering() -> None:
    """The per-layer devices show the kernel swap and the fallback; the `all`-only devices
    only an MFU drop. One page, lowering first, the kernel_lib change to roll back; where
    `all`-only devices are among its devices, lowering is named as not judged on those."""
    _, alerts = _run(mixed_pool(90, regress_at=50, change_at=49))
    firing = [a for a in alerts if a.status == "firing"]
    assert firing
    assert len({a.id for a in alerts}) == 1
    last = firing[-1]
    assert last.severity == "page"
    assert last.first_failing_stage == "lowering"
    assert last.bottleneck == "kernel_selection"
    assert last.suggestion.change_id == "chg-1"
    assert last.layers[0] == "attention"
    coarse = [d for d in last.scope.devices if d in COARSE]
    stages = {e.stage: e for e in last.not_judged}
    assert "lowering" in stages
    assert stages["lowering"].devices == len(coarse) < last.scope.device_count


def test_a_regression_seen_only_on_all_only_devices_pages_naming_what_it_could_not_judge() -> None:
    """The dcgm devices lose 25 % MFU, the per-layer devices nothing: it pages on the
    dcgm devices, attributed to execution (their arithmetic intensity on `all` fell with
    the FLOPs, but a whole-device ratio is no scheduling evidence), and names lowering and
    scheduling as not judged on every one of its devices, with the fields that were
    missing."""
    _, alerts = _run(mixed_pool(90, regress_at=50, regress="coarse"))
    firing = [a for a in alerts if a.status == "firing"]
    assert firing
    last = firing[-1]
    assert last.severity == "page"
    assert set(last.scope.devices) <= set(COARSE)
    assert last.layers == ["all"]
    assert last.first_failing_stage == "execution"
    assert last.bottleneck == "unclassified"
    assert last.suggestion.action == "investigate"
    stages = {e.stage: e for e in last.not_judged}
    assert {"lowering", "scheduling"} <= set(stages)
    for s in ("lowering", "scheduling"):
        assert stages[s].devices == last.scope.device_count
    assert "layers[].kernel" in stages["lowering"].missing
    assert "layers[].sram_hit" in stages["scheduling"].missing
    assert "execution" not in stages
    # On the wire, and back: the record carries it, and decodes with it.
    codec = Codec()
    wire = codec.encode(last)
    assert b'"not_judged":[' in wire
    assert codec.decode_alert(wire).not_judged == last.not_judged


def test_a_regression_only_on_the_per_layer_devices_names_no_unjudged_kernel_stage() -> None:
    """Only the per-layer devices regress: lowering is judged on every device of the
    incident, whatever the `all`-only devices of the pool cannot see."""
    _, alerts = _run(mixed_pool(90, regress_at=50, regress="layered", change_at=49))
    firing = [a for a in alerts if a.status == "firing"]
    assert firing
    last = firing[-1]
    assert set(last.scope.devices) <= set(LAYERED)
    assert last.first_failing_stage == "lowering"
    assert last.suggestion.change_id == "chg-1"
    assert "lowering" not in {e.stage for e in last.not_judged}
    # The factory's per-layer records carry no HBM bytes, SRAM hits, queue or SLO.
    assert [e.stage for e in last.not_judged] == ["ingress", "scheduling", "validation"]


def test_on_call_reads_what_was_not_judged_in_alertmanager_pagerduty_console_and_report() -> None:
    _, alerts = _run(mixed_pool(90, regress_at=50, change_at=49))
    last = [a for a in alerts if a.status == "firing"][-1]
    n = last.scope.device_count
    coarse = sum(d in COARSE for d in last.scope.devices)
    note = to_postable(last)["annotations"]["not_judged"]
    assert f"lowering on {coarse} of {n} devices (no layers[].kernel, layers[].fallback_frac)" in (
        note
    )
    assert note.startswith("ingress (no ingress.req_rate")  # every device: no "on N of M"
    assert _details(last, None, devices=False)["not_judged"] == note
    line = alert_text(last)
    assert f"| not judged: ingress, lowering ({coarse}/{n} devices), scheduling, validation |" in (
        line
    )
    html = incident_section(incident_views([last])[0])
    assert (
        f"no change found; not judged on {coarse} of {n} devices: no layers[].kernel" not in html
    )  # lowering has evidence: the note is a row of its own
    assert f'<td colspan="4">not judged on {coarse} of {n} devices: no layers[].kernel' in html
    assert '<td colspan="4">not judged: no ingress.req_rate' in html
    # A record where every stage was judged shows none of it.
    full = msgspec.structs.replace(last, not_judged=[])
    assert "not_judged" not in to_postable(full)["annotations"]
    assert "not judged" not in alert_text(full)
    assert "not judged" not in incident_section(incident_views([full])[0])
