"""Mixed granularity in one pool: per-layer devices (a profiler) beside devices that send
only the whole-device layer `all` (a dcgm-exporter sidecar), issue 22 item 4.

Each device is judged on what it sends, and the two kinds never share a pool aggregate.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from factories import PEAK, T0, msg, window

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.core.stream_table import COARSE_DEVICE_GROUP, StreamTable
from monitor.core.types import RawMessage
from monitor.hardware import Catalog
from monitor.indicators import DEVICE_METRICS
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
    only an MFU drop. One page, lowering first, the kernel_lib change to roll back."""
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
    assert {d for d in last.scope.devices if d in COARSE}  # the dcgm devices moved too


def test_a_regression_seen_only_on_all_only_devices_pages_as_execution() -> None:
    """The dcgm devices lose 25 % MFU, the per-layer devices nothing: it pages on the
    dcgm devices, attributed to execution: their arithmetic intensity on `all` fell with
    the FLOPs, but a whole-device ratio is no scheduling evidence."""
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


def test_a_regression_only_on_the_per_layer_devices_is_lowering() -> None:
    """Only the per-layer devices regress: attributed as on a pool of them alone."""
    _, alerts = _run(mixed_pool(90, regress_at=50, regress="layered", change_at=49))
    firing = [a for a in alerts if a.status == "firing"]
    assert firing
    last = firing[-1]
    assert set(last.scope.devices) <= set(LAYERED)
    assert last.first_failing_stage == "lowering"
    assert last.suggestion.change_id == "chg-1"
