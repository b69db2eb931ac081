"""The columnar batch -> frame path against the walk over records and layers it replaced.

`WalkTable` is that walk, kept here as the oracle: one Python step per record and per
layer, group ids, stream rows and kernel changes taken in walk order, and the loose cap
bound that sent every large batch through `_Room`. Random batches (repeated windows of a
device in one batch, pools renamed mid-batch, kernels coming and going, layers missing
counters, device-only "all" layers, caps that force evictions) must give the same frames,
rejections and table state, batch after batch.
"""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
from factories import T0
from hypothesis import example, given, settings
from hypothesis import strategies as st

from monitor.core.stream_table import COARSE_DEVICE_GROUP, StreamTable, _Columns, _Device
from monitor.hardware import Catalog
from monitor.indicators import LAYER_INPUTS
from monitor.wire import DeviceStats, Ingress, Layer, Slo, WindowRecord

_N_INPUTS = 1 + len(LAYER_INPUTS)


class WalkTable(StreamTable):
    """The stream table as it was: `_collect` walks every record and layer in Python."""

    def _over_caps(self, records: list[WindowRecord], picked: list[int]) -> bool:
        n_layers = sum(len(records[i].layers) for i in picked)
        return (
            (self.max_devices is not None and len(self.devices) + len(picked) > self.max_devices)
            or (self.max_streams is not None
                and len(self.layer_index) + n_layers > self.max_streams)
            or (self.max_groups is not None
                and len(self.groups) + n_layers + len(picked) > self.max_groups)
        )  # fmt: skip

    def _collect(  # noqa: C901 - the walk as it was
        self, accepted: list[tuple[WindowRecord, _Device]]
    ) -> _Columns:
        lrows, lts, lraw, lpeak, lgroup, lrec, lkernel = [], [], [], [], [], [], []
        kchanges: list[tuple[int, float, str | None, str]] = []
        drows, dts, dwin, dpeak, dflops, draw, dgroup, dload = [], [], [], [], [], [], [], []
        for rec, dev in accepted:
            flops_sum, any_flops = 0.0, False
            busy_sum, any_busy = 0.0, False
            for layer in rec.layers:
                row = self.layer_index.get((dev.row, layer.type))
                if row is None:
                    row = self._layer_row(dev.row, layer.type)
                lrows.append(row)
                lraw.append(msgspec.structs.astuple(layer)[1:_N_INPUTS])
                lgroup.append(self._group_id(dev, layer.type))
                if layer.flops is not None and layer.type != "all":
                    flops_sum += layer.flops
                    any_flops = True
                if layer.busy_s is not None and layer.type != "all":
                    busy_sum += layer.busy_s
                    any_busy = True
                lkernel.append(layer.kernel is not None)
                if layer.kernel is not None:
                    old = self.last_kernel[row]
                    if old != layer.kernel:
                        if old is not None:
                            kchanges.append((row, rec.ts, old, layer.kernel))
                        self.last_kernel[row] = layer.kernel
                lts.append(rec.ts)
                lpeak.append(dev.peak)
                lrec.append(len(drows))
            if not any_flops:
                alls = [la.flops for la in rec.layers if la.type == "all" and la.flops is not None]
                flops_sum, any_flops = (alls[0], True) if alls else (0.0, False)
            if not any_busy:
                alls = [
                    la.busy_s for la in rec.layers if la.type == "all" and la.busy_s is not None
                ]
                busy_sum, any_busy = (alls[0], True) if alls else (0.0, False)
            busy = min(busy_sum / rec.window_s, 1.0) if any_busy else None
            ing, stt, slo = rec.ingress, rec.device_stats, rec.slo
            coarse = bool(rec.layers) and all(la.type == "all" for la in rec.layers)
            dgroup.append(self._group_id(dev, COARSE_DEVICE_GROUP if coarse else ""))
            dload.append((ing.batch, ing.req_rate, busy) if ing else (None, None, busy))
            drows.append(dev.row)
            dts.append(rec.ts)
            dwin.append(rec.window_s)
            dpeak.append(dev.peak)
            dflops.append(flops_sum if any_flops else np.nan)
            draw.append((
                stt.clock_mhz if stt else None, stt.temp_c if stt else None,
                stt.power_w if stt else None,
                ing.req_rate if ing else None, ing.queue_depth if ing else None,
                ing.queue_wait_ms if ing else None, ing.batch if ing else None,
                slo.lat_p50_ms if slo else None, slo.lat_p95_ms if slo else None,
                slo.lat_p99_ms if slo else None, slo.quality if slo else None,
                slo.errors if slo else None,
            ))  # fmt: skip

        def ints(x: list[int]) -> np.ndarray:
            return np.array(x, dtype=np.int64)

        def floats(x: list, width: int | None = None) -> np.ndarray:
            a = np.array(x, dtype=np.float64)
            return a if width is None else a.reshape(-1, width)

        return _Columns(
            lrows=ints(lrows), lts=floats(lts), lraw=floats(lraw, len(LAYER_INPUTS)),
            lpeak=floats(lpeak), lgroup=ints(lgroup), lrec=ints(lrec), kchanges=kchanges,
            drows=ints(drows), dts=floats(dts), dwin=floats(dwin), dpeak=floats(dpeak),
            dflops=floats(dflops), draw=floats(draw, 12), dgroup=ints(dgroup),
            dload=floats(dload, 3), lkernel=np.array(lkernel, dtype=bool),
        )  # fmt: skip


_maybe = st.none() | st.sampled_from([0.0, 1.5, 3e14, 7e14])
_layer = st.builds(
    Layer,
    type=st.sampled_from(["attention", "mlp", "all", "norm"]),
    flops=_maybe, busy_s=st.none() | st.sampled_from([0.0, 2.0, 6.0]),
    cycles=st.none() | st.just(1e10), stall_mem_cycles=st.none() | st.just(3e9),
    occupancy=st.none() | st.just(0.5), kernel=st.none() | st.sampled_from(["fa2", "fa3"]),
)  # fmt: skip
_record = st.builds(
    WindowRecord,
    v=st.just(1),
    ts=st.integers(1, 6).map(lambda w: T0 + 10.0 * w),
    window_s=st.sampled_from([10.0, 5.0]),
    device=st.sampled_from([f"n{i // 2}/gpu{i % 2}" for i in range(5)]),
    layers=st.lists(_layer, max_size=4, unique_by=lambda la: la.type),
    host=st.just("n0"),
    pool=st.sampled_from(["p0", "p1", None]),
    model=st.sampled_from(["m@1", "m@2"]),
    hw=st.sampled_from(["h100-sxm", "tpu-x"]),
    dtype=st.just("bf16"),
    ingress=st.none() | st.builds(Ingress, req_rate=_maybe, batch=st.none() | st.just(32.0)),
    device_stats=st.none() | st.builds(DeviceStats, power_w=st.none() | st.just(600.0)),
    slo=st.none() | st.builds(
        Slo, quality=st.none() | st.just(0.99), errors=st.none() | st.just(0.0) | st.just(3.0)
    ),
)  # fmt: skip
_caps = st.sampled_from([(None, None, None), (3, None, None), (None, 5, None), (None, None, 4)])


def _assert_same(got: object, want: object) -> None:
    for f in dataclasses.fields(want):  # type: ignore[arg-type]
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=f.name, strict=True)
        else:
            assert a == b, f.name


# A device sending only "all" is a device-level family of its own: with another device's
# first layers in the same batch that is one group more than the cheap bound once counted.
_ALL_THEN_LAYERS = [[
    WindowRecord(1, T0 + 10.0, 10.0, "n0/gpu0", [], host="n0", model="m@1", hw="h100-sxm",
                 dtype="bf16"),
    WindowRecord(1, T0 + 10.0, 10.0, "n0/gpu1", [Layer("all")], host="n0", model="m@1",
                 hw="h100-sxm", dtype="bf16"),
    WindowRecord(1, T0 + 20.0, 10.0, "n0/gpu0", [Layer("attention"), Layer("mlp")], host="n0",
                 model="m@1", hw="h100-sxm", dtype="bf16"),
]]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_record, max_size=8), min_size=1, max_size=5), _caps)
@example(_ALL_THEN_LAYERS, (None, None, 4))
def test_frames_and_state_match_the_walk(batches: list[list[WindowRecord]], caps: tuple) -> None:
    """Every batch: the same frame (kernel changes included), rejections, evictions and,
    at the end, the same table snapshot as the per-layer walk."""
    max_devices, max_streams, max_groups = caps
    tables = [cls(Catalog(), max_devices=max_devices, max_streams=max_streams,
                  max_groups=max_groups) for cls in (StreamTable, WalkTable)]  # fmt: skip
    for batch in batches:
        (got, got_rej), (want, want_rej) = (t.build(batch) for t in tables)
        _assert_same(got, want)
        assert got_rej == want_rej
        _assert_same(tables[0].take_evicted(), tables[1].take_evicted())
    assert tables[0].snapshot() == tables[1].snapshot()
    assert tables[0].unknown_hw == tables[1].unknown_hw


def _rec(device: str, w: int, *layers: tuple[str, str | None]) -> WindowRecord:
    return WindowRecord(1, T0 + 10.0 * w, 10.0, device, [Layer(t, kernel=k) for t, k in layers],
                        pool="p", model="m", hw="h100-sxm", dtype="bf16")  # fmt: skip


def test_kernel_changes_within_one_batch_compare_entry_by_entry() -> None:
    """Three windows of one device in one batch: fa3 -> fa2 (said), no kernel (nothing),
    back to fa3 (said, against fa2); a stream's first kernel is no change."""
    table = StreamTable(Catalog())
    frame, _ = table.build([_rec("d", 1, ("attention", "fa3"), ("mlp", None))])
    assert frame.kernel_changes == []
    frame, _ = table.build([
        _rec("d", 4, ("attention", "fa3"), ("mlp", "gemm")),
        _rec("d", 2, ("attention", "fa2"), ("mlp", None)),
        _rec("d", 3, ("attention", None)),
    ])  # fmt: skip
    attn = table.layer_index[(table.devices["d"].row, "attention")]
    assert frame.kernel_changes == [
        (attn, T0 + 20.0, "fa3", "fa2"),
        (attn, T0 + 40.0, "fa2", "fa3"),
    ]
    assert table.last_kernel[attn] == "fa3"
    assert table.last_kernel[table.layer_index[(table.devices["d"].row, "mlp")]] == "gemm"
