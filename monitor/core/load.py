"""Load awareness: detect on `y / expected(y | load)` so a traffic burst is not a regression.

MFU, stall fraction, latency and queueing move with batch size and request
rate. For each load-sensitive column, one `LoadModel` per (pool, model, layer)
group learns the expectation from log(1 + batch), log(1 + req_rate) and 1 / batch; the
detector sees the ratio, about 1.0 at any load. A regression that shows only
under burst load still moves the ratio during bursts, so it is still caught.
Columns that are not load-driven (clock, temperature, kernel fallback, quality)
pass through unchanged. Where a group's model has under `min_support` windows of
data at the group's current load (a pool's first burst), the ratio would measure
the model's extrapolation error, so it is withheld (NaN) while the model learns
(and, in a group frozen while its incident pages, until it thaws).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from monitor.arrays import F64, I64, Bools
from monitor.core.exposure import SAME_LOAD
from monitor.core.load_model import LoadModel
from monitor.indicators import BAD_DIRECTION

# Load-driven columns; the rest are judged on their raw values.
LOAD_SENSITIVE = frozenset({
    "mfu", "stall_frac", "arith_intensity", "occupancy", "sync_frac",
    "device_mfu", "power_w", "lat_p50_ms", "lat_p95_ms", "lat_p99_ms",
    "queue_wait_ms", "queue_depth",
})  # fmt: skip
# Columns judged raw but withheld with the load-driven ones at a load the group's model has
# not seen: failed requests, which a queue at its admission limit sheds. What a pool fails
# at a load it never ran at is news about its capacity (the queue's ratio, withheld there
# too, says the same once the model has learnt), not a regression of its service.
LOAD_GATED = frozenset({"error_rate"})


def back_to_expected(
    metrics: list[str], before: F64, after: F64, ratio_after: F64, floor_rel: F64
) -> Bools:
    """Which changes went the bad way only back to what the load model expects.

    A load-normalised stream whose new level is what its own history predicts at its load
    (a ratio within the reporting floor of 1) did not regress: the level before was the
    excursion, as when a burst the model under-predicted ends. Its steps the good way are
    kept: a fix showing is one of them.
    """
    sensitive = np.array([m in LOAD_SENSITIVE for m in metrics], dtype=bool)
    sign = np.array([BAD_DIRECTION.get(m, 0) for m in metrics], dtype=np.float64)
    worse = (after - before) * sign > 0
    with np.errstate(invalid="ignore"):
        normal = np.abs(ratio_after - 1.0) < floor_rel
    out: Bools = sensitive & worse & normal
    return out


# Features' reporting floors, in their units (`LoadModel`'s jitter): request rates within
# the rate's floor of each other are one load (as `exposure.SAME_LOAD`), so a rate that
# differs by less between devices, or drifts by less over a stream's memory, teaches the
# model no response to it. A pool's devices' own rates differ by a few per cent for reasons
# of their own (a balancer's weight, a slower device kept busier), persistently; learnt as
# load, their latency differences read as a steep response, and a fraction of a per cent
# of jitter in a device's rate moved its expectation by tens of per cent. The batch is a
# count the engine sets: exact.
FEATURE_FLOORS = (0.0, math.log1p(SAME_LOAD), 0.0)


class LoadAdjuster:
    """Turns a wave's value matrix into load-normalised ratios, all columns at once.

    One `LoadModel` holds every load-sensitive column's models: the (group, column)
    pair is model ``group * C + slot`` (C load-sensitive columns). Each pair learns
    exactly what a model of its own would (same samples, same order), but a wave costs
    one call instead of one per column; at a partition's wave sizes the calls' fixed
    cost is most of the load models' time.
    """

    def __init__(
        self, columns: tuple[str, ...], forget: float = 0.99, min_support: float = 0.0
    ) -> None:
        self.columns = columns
        self.min_support = float(min_support)
        self.extrapolated = 0  # samples withheld from detection: load outside the model's data
        self._cols = np.array(
            [i for i, m in enumerate(columns) if m in LOAD_SENSITIVE], dtype=np.int64
        )
        self._gated = np.array(
            [i for i, m in enumerate(columns) if m in LOAD_GATED], dtype=np.int64
        )
        self._forget = float(forget)
        n = max(self._cols.size, 1)
        self._model = LoadModel(3, forget=forget, capacity=16 * n, jitter=FEATURE_FLOORS)

    def _ids(self, groups: I64) -> I64:
        """Model ids of (group, slot) pairs: one row per group, one column per slot."""
        c = self._cols.size
        # Room for every slot of the largest group first, so the capacity stays a multiple
        # of C (the per-column checkpoints slice it).
        if groups.size:
            self._model.reserve((int(groups.max()) + 1) * c)
        ids: I64 = groups[:, None] * c + np.arange(c)
        return ids

    def adjust(self, groups: I64, load: F64, values: F64) -> tuple[F64, F64]:
        """(ratios, expected): NaN ratio while a group's model warms up or expects <= 0."""
        ratios = values.copy()
        expected = np.ones_like(values)
        if self._cols.size == 0:
            return ratios, expected
        groups = np.asarray(groups, dtype=np.int64)
        known = np.nan_to_num(load, nan=0.0)
        # log terms for throughput scaling, 1/batch for fixed per-step overheads that
        # amortise away as batches grow (MFU flattens out at large batch).
        feats = np.column_stack([np.log1p(known), 1.0 / np.maximum(known[:, 0], 1.0)])
        y = values[:, self._cols]
        c = self._cols.size
        want_support = self.min_support > 0
        # The usual wave: every value measured, no group frozen. Its (group, column) models
        # share their rows, and the grid form sums each group's rows once for all of them.
        if groups.size and self._model.complete(groups, c, feats, y):
            support, exp = self._model.learn_grid(
                groups, c, feats, y, support=want_support, trust=self.min_support
            )
            novel = self._withhold(support, exp)
            self._gate(ratios, None if novel is None else np.asarray(novel.any(axis=1)))
            return self._ratios(ratios, expected, y, exp)
        # Column-major: each (group, column) model sees its samples in row order, as a
        # model of its own per column would.
        slot, row = np.nonzero(np.isfinite(y).T)
        exp = np.full(y.shape, np.nan)
        if row.size:
            ids = self._ids(groups)[row, slot]
            f = feats[row]
            support = self._model.support(ids, f) if want_support else None
            novel_load = None if support is None else support < self.min_support
            exp_ok = self._model.update(ids, f, y[row, slot], unclipped=novel_load)
            novel = self._withhold(support, exp_ok)
            exp[row, slot] = exp_ok
            if novel is not None:
                rows_novel = np.zeros(y.shape[0], dtype=bool)
                rows_novel[row[novel]] = True
                self._gate(ratios, rows_novel)
        return self._ratios(ratios, expected, y, exp)

    def _withhold(self, support: F64 | None, exp: F64) -> Bools | None:
        """NaN where the model's support (taken before learning) is under `min_support`;
        returns where (None without a support test).

        The first windows at a load the model has not seen (a pool's first burst) are
        extrapolation: the ratio would measure the model's error, not the device. Withhold
        them from detection (NaN) but learn from them. A frozen group (its incident is
        paging) cannot learn, so there it lasts until the group thaws: judged on the
        extrapolation instead, a burst would read as a shift of level on every device, and
        its end as a drop back.
        """
        if support is None:
            return None
        novel: Bools = (support < self.min_support) & np.isfinite(exp)
        exp[novel] = np.nan
        self.extrapolated += int(novel.sum())
        return novel

    def _gate(self, ratios: F64, novel_rows: Bools | None) -> None:
        """NaN in the gated columns (`LOAD_GATED`) of rows whose load is novel in any
        load-driven column."""
        if novel_rows is not None and self._gated.size and novel_rows.any():
            ratios[np.ix_(novel_rows, self._gated)] = np.nan

    def _ratios(self, ratios: F64, expected: F64, y: F64, exp: F64) -> tuple[F64, F64]:
        """`adjust`'s outputs from the load-sensitive columns' values and expectations."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[:, self._cols] = np.where(exp > 0, y / exp, np.nan)
        expected[:, self._cols] = exp
        return ratios, expected

    def hold(self, groups: I64, *, hold: bool, metrics: Iterable[str] | None = None) -> None:
        """Stop (or resume) learning for these groups in the models of `metrics` (every
        load-driven column's where None; columns not load-driven have none)."""
        groups = np.asarray(groups, dtype=np.int64)
        if self._cols.size == 0 or groups.size == 0:
            return
        ids = self._ids(groups)
        if metrics is not None:
            want = {self.columns.index(m) for m in metrics if m in self.columns}
            ids = ids[:, [j for j, c in enumerate(self._cols.tolist()) if c in want]]
        (self._model.freeze if hold else self._model.thaw)(ids.reshape(-1))

    def inherit(self, src: I64, dst: I64) -> None:
        """New groups `dst` start from what groups `src` learned (every column's model)."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        if self._cols.size and src.size:
            self._model.reserve((int(max(src.max(), dst.max())) + 1) * self._cols.size)
            self._model.copy(self._ids(src).reshape(-1), self._ids(dst).reshape(-1))

    def forget(self, groups: I64) -> None:
        """Reset released groups' models (every column's), so that their ids can be reused."""
        groups = np.asarray(groups, dtype=np.int64)
        if self._cols.size and groups.size:
            ids: I64 = groups[:, None] * self._cols.size + np.arange(self._cols.size)
            self._model.reset(ids.reshape(-1))

    def snapshot(self) -> dict[int, bytes]:
        """Each column's models as a `LoadModel` of its own (the checkpoint format)."""
        c = self._cols.size
        return {
            int(col): self._model.take_slots(j, c).snapshot() for j, col in enumerate(self._cols)
        }

    def restore(self, blobs: dict[int, bytes]) -> None:
        """Load column models saved by `snapshot` (by this class or its per-column form)."""
        slots = {int(col): j for j, col in enumerate(self._cols)}
        parts = {slots[c]: LoadModel.restore(b) for c, b in blobs.items() if c in slots}
        self._model = LoadModel.interleave(
            parts, self._cols.size, forget=self._forget, jitter=FEATURE_FLOORS
        )
