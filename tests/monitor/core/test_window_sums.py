"""Aggregates wait for their window to be complete, whatever the batch boundaries."""

from __future__ import annotations

import itertools
import json

import numpy as np
from factories import T0, window
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core.stream_table import StreamTable
from monitor.core.window_sums import OpenWindows
from monitor.hardware import Catalog
from monitor.indicators import LAYER_METRICS
from monitor.wire import Codec

W = 10.0


def _entries(group: int, ts: float, values: list[float]) -> tuple[list[int], list[float], list]:
    return [group] * len(values), [ts] * len(values), [[v, 1.0] for v in values]


def _take(ow: OpenWindows, groups: list[int], ts: list[float], vals: list) -> list[tuple]:
    g, t, s, c = ow.take(np.array(groups, dtype=np.int64), np.array(ts, dtype=np.float64),
                         np.array(vals, dtype=np.float64).reshape(-1, 2))  # fmt: skip
    return [(int(a), float(b), float(x[0]), float(n[0]))
            for a, b, x, n in zip(g, t, s, c, strict=True)]  # fmt: skip


def test_a_window_split_over_two_batches_is_one_sample() -> None:
    """A batch that ends inside a window gives nothing out for it; the next batch's part is
    added, and the window goes out once, whole."""
    ow = OpenWindows()
    assert _take(ow, *_entries(0, T0, [1.0, 2.0, 3.0, 4.0])) == [(0, T0, 10.0, 4.0)]
    assert _take(ow, *_entries(0, T0 + W, [1.0, 1.0])) == []
    g1, t1, v1 = _entries(0, T0 + W, [2.0, 2.0])
    g2, t2, v2 = _entries(0, T0 + 2 * W, [5.0, 5.0, 5.0, 5.0])
    assert _take(ow, g1 + g2, t1 + t2, v1 + v2) == [(0, T0 + W, 6.0, 4.0),
                                                    (0, T0 + 2 * W, 20.0, 4.0)]  # fmt: skip
    # Late entries of a window already given out are not a second sample.
    assert _take(ow, *_entries(0, T0 + W, [9.0])) == []


def test_a_member_that_goes_silent_holds_one_window_only() -> None:
    """A window short of a member waits for the next window of its group, which then shows
    the group is smaller: the window after that goes out at once."""
    ow = OpenWindows()
    _take(ow, *_entries(3, T0, [1.0, 1.0, 1.0]))
    assert _take(ow, *_entries(3, T0 + W, [1.0, 1.0])) == []
    assert _take(ow, *_entries(3, T0 + 2 * W, [2.0, 2.0])) == [(3, T0 + W, 2.0, 2.0),
                                                             (3, T0 + 2 * W, 4.0, 2.0)]  # fmt: skip
    assert _take(ow, *_entries(3, T0 + 3 * W, [1.0, 1.0])) == [(3, T0 + 3 * W, 2.0, 2.0)]
    # A forgotten group starts afresh (its id may be reused).
    ow.forget([3])
    assert _take(ow, *_entries(3, T0, [7.0])) == [(3, T0, 7.0, 1.0)]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    n_windows=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 200), max_size=8),
    seed=st.integers(0, 2**16),
)
def test_aggregates_do_not_depend_on_where_batches_end(
    sizes: list[int], n_windows: int, cuts: list[int], seed: int
) -> None:
    """Once every group's size is known, cutting the stream into batches anywhere gives the
    same (group, window, sum) samples, in each group's time order, as one batch per window."""
    rng = np.random.default_rng(seed)
    stream = [(g, T0 + w * W, float(rng.integers(0, 100)))
              for w in range(n_windows + 2)
              for g, n in enumerate(sizes) for _ in range(n)]  # fmt: skip
    first = sum(sizes)  # the first window of every group: what makes its size known

    def run(bounds: list[int]) -> list[tuple]:
        ow, out = OpenWindows(), []
        for lo, hi in itertools.pairwise(bounds):
            part = stream[lo:hi]
            out += _take(ow, [p[0] for p in part], [p[1] for p in part],
                         [[p[2], 1.0] for p in part])  # fmt: skip
        return out

    last = len(stream) - sum(sizes)  # the final window closes every held one
    per_window = list(range(0, len(stream) + 1, sum(sizes)))
    inner = sorted({first, last, *(first + c % max(1, last - first) for c in cuts)})
    split = run([0, *inner, len(stream)])
    whole = run(per_window)
    for g in range(len(sizes)):
        mine = [x for x in split if x[0] == g]
        assert mine == [x for x in whole if x[0] == g]
        assert [x[1] for x in mine] == sorted({x[1] for x in mine})


def test_a_pool_aggregate_split_over_two_builds_equals_the_whole() -> None:
    """The stream table's pool aggregates: a window cut between two batches gives the
    pool MFU of all its devices, once."""
    c = Codec()
    devices = [f"n{i // 8}/gpu{i % 8}" for i in range(8)]

    def recs(ts: float, names: list[str]) -> list:
        return [c.decode_window(json.dumps(window(d, ts, mfu=0.1 * (i + 1))).encode())
                for i, d in enumerate(names)]  # fmt: skip

    mfu = LAYER_METRICS.index("mfu")
    whole, split = StreamTable(Catalog()), StreamTable(Catalog())
    whole.build(recs(T0, devices))
    split.build(recs(T0, devices))
    want, _ = whole.build(recs(T0 + W, devices))
    part, _ = split.build(recs(T0 + W, devices)[:3])
    assert part.pool_layer_rows.size == 0
    assert part.pool_device_rows.size == 0
    rest, _ = split.build(recs(T0 + W, devices)[3:])
    assert rest.pool_layer_ts.tolist() == want.pool_layer_ts.tolist()
    assert np.allclose(rest.pool_layer_values[:, mfu], want.pool_layer_values[:, mfu])
    assert rest.pool_device_rows.tolist() == want.pool_device_rows.tolist()
    # ... and counts all eight devices behind it (the /metrics device gauge).
    assert rest.pool_layer_devices.tolist() == [8.0] * rest.pool_layer_rows.size
