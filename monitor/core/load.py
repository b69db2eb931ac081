"""Load awareness: detect on `y / expected(y | load)` so a traffic burst is not a regression.

MFU, stall fraction, latency and queueing move with batch size and request
rate. For each load-sensitive column, one `LoadModel` per (pool, model, layer)
group learns the expectation from log(1 + batch), log(1 + req_rate) and 1 / batch
(queueing columns: and the devices' utilisation, `LoadAdjuster`); the
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
from monitor.indicators import (
    BAD_DIRECTION,
    DEFAULT_MIN_REL_CHANGE,
    QUEUEING,
    WAITING,
)

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
# The queueing columns' features add utilisation's queueing factor (`queueing_load`), a
# busy fraction the device measures itself: no floor of its own.
QUEUE_FEATURE_FLOORS = (*FEATURE_FLOORS, 0.0)


# The checkpoint keys of the streams' saturation state (column keys are >= 0): the counts
# and ceilings, and the windows short of a whole window (`SHORT_KEY`, added later: a
# checkpoint without it restores each stream's calm count in its place).
CALM_KEY = -1
SHORT_KEY = -2
# Whether a stream's load sets its utilisation (a serving engine) or it runs flat out by
# design (training) is its workload's, not the hour's: judged over the load's own cycle,
# a day of the contract's 10 s windows, so that hours of bursts do not turn a serving
# pool into one that is always saturated.
CALM_MEMORY = 86_400 / 10
# Work served: while the devices keep up it is the work offered, a function of the load;
# saturated, it is their capacity, less than the offered load predicts.
SERVED = frozenset({"device_mfu"})
# A busy fraction within the default reporting floor (`DEFAULT_MIN_REL_CHANGE`) of a whole
# window is near one: the highest a stream shows there is the ceiling it saturates at.
SATURATED = 1.0 - DEFAULT_MIN_REL_CHANGE
# Busy fractions are known to a per cent (nvidia-smi's and DCGM's utilisation gauges report
# whole per cents): one within that of the stream's ceiling is at it.
BUSY_RESOLUTION = 0.01


def queueing_load(util: F64) -> F64:
    """rho / (1 - rho) of each busy fraction rho; 0 where unmeasured.

    How a queue's wait grows with its server's utilisation (M/M/1's factor): a pool running
    hot waits three times as long at 0.95 busy as at 0.85, with its batch and request rate
    within a few per cent, which no expectation linear in those can follow. Headroom is
    known only to the busy fraction's resolution, so rho stops one resolution short of 1.
    """
    rho = np.clip(np.nan_to_num(util, nan=0.0), 0.0, 1.0 - BUSY_RESOLUTION)
    out: F64 = rho / (1.0 - rho)
    return out


class _Models:
    """One `LoadModel` holding a set of load-sensitive columns' models, all columns at once.

    The (group, column) pair is model ``group * C + slot`` (C columns). Each pair learns
    exactly what a model of its own would (same samples, same order), but a wave costs
    one call instead of one per column; at a partition's wave sizes the calls' fixed
    cost is most of the load models' time.
    """

    def __init__(
        self, cols: I64, jitter: tuple[float, ...], forget: float, min_support: float,
        saturates: bool,
    ) -> None:  # fmt: skip
        self.cols = cols
        self.min_support = min_support
        self.saturates = saturates  # withheld at saturation
        self.utilisation = len(jitter) > len(FEATURE_FLOORS)  # `queueing_load` a feature
        n_features = len(jitter)
        self.extrapolated = 0
        self._forget = forget
        self._jitter = jitter
        n = max(cols.size, 1)
        self.model = LoadModel(n_features, forget=forget, capacity=16 * n, jitter=jitter)

    def ids(self, groups: I64) -> I64:
        """Model ids of (group, slot) pairs: one row per group, one column per slot."""
        c = self.cols.size
        # Room for every slot of the largest group first, so the capacity stays a multiple
        # of C (the per-column checkpoints slice it).
        if groups.size:
            self.model.reserve((int(groups.max()) + 1) * c)
        ids: I64 = groups[:, None] * c + np.arange(c)
        return ids

    def adjust(self, groups: I64, feats: F64, y: F64) -> tuple[F64, Bools | None]:
        """(expected per sample, rows withheld at a novel load); NaN y is neither learned
        from nor judged."""
        c = self.cols.size
        want_support = self.min_support > 0
        # The usual wave: every value measured, no group frozen. Its (group, column) models
        # share their rows, and the grid form sums each group's rows once for all of them.
        if groups.size and self.model.complete(groups, c, feats, y):
            support, exp = self.model.learn_grid(
                groups, c, feats, y, support=want_support, trust=self.min_support
            )
            novel = self._withhold(support, exp)
            return exp, None if novel is None else np.asarray(novel.any(axis=1))
        # Column-major: each (group, column) model sees its samples in row order, as a
        # model of its own per column would.
        slot, row = np.nonzero(np.isfinite(y).T)
        exp = np.full(y.shape, np.nan)
        rows_novel = None
        if row.size:
            ids = self.ids(groups)[row, slot]
            f = feats[row]
            support = self.model.support(ids, f) if want_support else None
            novel_load = None if support is None else support < self.min_support
            exp_ok = self.model.update(ids, f, y[row, slot], unclipped=novel_load)
            novel = self._withhold(support, exp_ok)
            exp[row, slot] = exp_ok
            if novel is not None:
                rows_novel = np.zeros(y.shape[0], dtype=bool)
                rows_novel[row[novel]] = True
        return exp, rows_novel

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

    def snapshot(self) -> dict[int, bytes]:
        """Each column's models as a `LoadModel` of its own (the checkpoint format)."""
        c = self.cols.size
        return {int(col): self.model.take_slots(j, c).snapshot() for j, col in enumerate(self.cols)}

    def restore(self, blobs: dict[int, bytes]) -> None:
        """Load column models saved by `snapshot`; a column saved with other features (an
        older checkpoint's) starts fresh."""
        slots = {int(col): j for j, col in enumerate(self.cols)}
        parts = {slots[c]: LoadModel.restore(b) for c, b in blobs.items() if c in slots}
        parts = {j: m for j, m in parts.items() if m.n_features == self.model.n_features}
        self.model = LoadModel.interleave(
            parts, self.cols.size, forget=self._forget, jitter=self._jitter,
            n_features=self.model.n_features,
        )  # fmt: skip


class LoadAdjuster:
    """Turns a wave's value matrix into load-normalised ratios, all columns at once.

    Expectations follow the load: batch and request rate. A queue's own columns
    (`WAITING`: its wait and length) follow utilisation as well, the devices' busy
    fraction (the load's third column where given): a queue's wait grows as
    rho / (1 - rho). Nothing else does: a slower kernel or a throttled clock makes the
    devices busier at the same load, and its latency and efficiency must show that.

    At saturation (`_saturated`) the queue is not in steady state: the batch pins at its
    cap and a backlog grows or drains, so its wait is the history of the bursts, not a
    function of the load, and the devices serve their capacity, not the offered load.
    There queueing, latency and served work (`SERVED`) are neither learnt from nor judged
    (NaN), and failed requests (`LOAD_GATED`: shed at the admission limit) are withheld
    with them: how a saturated pool fares is judged burst against burst
    (`core.exposure`), not against calm. Per-layer efficiency is still judged there.
    """

    def __init__(
        self, columns: tuple[str, ...], forget: float = 0.99, min_support: float = 0.0
    ) -> None:
        self.columns = columns
        self.min_support = float(min_support)
        sensitive = [i for i, m in enumerate(columns) if m in LOAD_SENSITIVE]
        self._gated = np.array(
            [i for i, m in enumerate(columns) if m in LOAD_GATED], dtype=np.int64
        )
        self._forget = float(forget)
        # Per stream (`adjust`'s rows): windows with a busy fraction, those of them below
        # its saturation ceiling (exponentially weighted over `CALM_MEMORY` calls), the
        # ceiling, and the windows short of a whole window (`SATURATED`), weighted as the
        # counts (`_saturated`). Checkpointed under `CALM_KEY` and `SHORT_KEY`.
        self._calm = np.zeros((4, 16))

        def pick(want: frozenset[str], but: frozenset[str] = frozenset()) -> I64:
            return np.array(
                [i for i in sensitive if columns[i] in want and columns[i] not in but],
                dtype=np.int64,
            )

        # (columns, features, withheld at saturation): efficiency; what a saturated pool's
        # capacity and backlog decide, latency (wait plus service: utilisation would
        # explain a slower service away) and served work; the queue itself.
        parts = (
            (pick(LOAD_SENSITIVE, QUEUEING | SERVED), FEATURE_FLOORS, False),
            (pick((QUEUEING - WAITING) | SERVED), FEATURE_FLOORS, True),
            (pick(WAITING), QUEUE_FEATURE_FLOORS, True),
        )
        self._parts = [
            _Models(cols, jitter, self._forget, self.min_support, saturates)
            for cols, jitter, saturates in parts
            if cols.size
        ]
        self._saturates = any(p.saturates for p in self._parts)

    @property
    def extrapolated(self) -> int:
        """Samples withheld from detection: load outside the model's data, or saturation."""
        return sum(p.extrapolated for p in self._parts)

    def adjust(
        self, groups: I64, load: F64, values: F64, rows: I64 | None = None
    ) -> tuple[F64, F64]:
        """(ratios, expected): NaN ratio while a group's model warms up or expects <= 0.

        `load` holds batch, request rate and (optional) busy fraction per row; `rows`:
        each row's stream (whose saturation ceiling it is), else its group's.
        """
        ratios = values.copy()
        expected = np.ones_like(values)
        if not self._parts:
            return ratios, expected
        groups = np.asarray(groups, dtype=np.int64)
        known = np.nan_to_num(load[:, :2], nan=0.0)
        # log terms for throughput scaling, 1/batch for fixed per-step overheads that
        # amortise away as batches grow (MFU flattens out at large batch).
        feats = np.column_stack([np.log1p(known), 1.0 / np.maximum(known[:, 0], 1.0)])
        withheld = np.zeros(values.shape[0], dtype=bool)
        util = load[:, 2] if load.shape[1] > 2 else np.full(values.shape[0], np.nan)
        full = np.zeros(values.shape[0], dtype=bool)
        if self._saturates:
            full = self._saturated(groups if rows is None else np.asarray(rows, np.int64), util)
        for part in self._parts:
            y = values[:, part.cols]
            f = np.column_stack([feats, queueing_load(util)]) if part.utilisation else feats
            if part.saturates and full.any():
                y = y.copy()
                y[full] = np.nan
                part.extrapolated += int(np.isfinite(values[full][:, part.cols]).sum())
                withheld |= full
            exp, novel = part.adjust(groups, f, y)
            if novel is not None:
                withheld |= novel
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios[:, part.cols] = np.where(exp > 0, values[:, part.cols] / exp, np.nan)
            expected[:, part.cols] = exp
        if self._gated.size and withheld.any():
            ratios[np.ix_(withheld, self._gated)] = np.nan
        return ratios, expected

    def _saturated(self, streams: I64, util: F64) -> Bools:
        """Rows at their stream's saturation ceiling, of a stream whose windows mostly are
        not; then each measured stream's ceiling and counts updated (forgetting once per
        call, as the models do).

        The ceiling is the highest busy fraction the stream (a device, a pool's aggregate)
        has shown, where that is near a whole window (`SATURATED`): the pinned utilisation
        of an engine that cannot take more. A row within the busy fraction's resolution
        (`BUSY_RESOLUTION`) of it is at it. A stream runs flat out by design (training
        steps back to back) when its windows are mostly at it, or when it is hardly ever
        short of a whole window (`SATURATED`): no more often than the reporting floor's
        share of its windows (`DEFAULT_MIN_REL_CHANGE`), as a checkpoint or a restart
        leaves it. It has no backlog, and its queue, service and served work are judged
        as any other's. The second test is for a training device whose step's length
        wanders by a few per cent, more than the gauge's resolution: most of its windows
        sit below its highest one, though none is short of a whole window. A serving
        pool's load sets its utilisation: its calm windows are short of a whole window,
        however hot it runs in bursts.
        """
        measured = np.isfinite(util)
        if not measured.any():
            return np.zeros(util.size, dtype=bool)
        top = int(streams.max()) + 1
        self._reserve_calm(top)
        g, u = streams[measured], util[measured]
        np.maximum.at(self._calm[2], g, u)
        ceiling = self._calm[2, streams]
        at_top = np.nan_to_num(util) >= ceiling - BUSY_RESOLUTION
        full = measured & (ceiling >= SATURATED) & at_top
        rows, calm, short = self._calm[0, streams], self._calm[1, streams], self._calm[3, streams]
        # Most of its windows below it, and short of a whole window more than by accident.
        out: Bools = full & (2.0 * calm > rows) & (short > DEFAULT_MIN_REL_CHANGE * rows)
        n = np.bincount(g, minlength=top)
        seen = np.flatnonzero(n)
        added = np.stack([
            n[seen],
            np.bincount(g, weights=~full[measured], minlength=top)[seen],
            np.bincount(g, weights=u < SATURATED, minlength=top)[seen],
        ])  # fmt: skip
        at = np.ix_(np.array([0, 1, 3]), seen)
        self._calm[at] = (1.0 - 1.0 / CALM_MEMORY) * self._calm[at] + added
        return out

    def _reserve_calm(self, n_streams: int) -> None:
        have = self._calm.shape[1]
        if n_streams > have:
            grown = np.zeros((4, max(n_streams, 2 * have)))
            grown[:, :have] = self._calm
            self._calm = grown

    def hold(self, groups: I64, *, hold: bool, metrics: Iterable[str] | None = None) -> None:
        """Stop (or resume) learning for these groups in the models of `metrics` (every
        load-driven column's where None; columns not load-driven have none)."""
        groups = np.asarray(groups, dtype=np.int64)
        if groups.size == 0:
            return
        want = None
        if metrics is not None:
            want = {self.columns.index(m) for m in metrics if m in self.columns}
        for part in self._parts:
            ids = part.ids(groups)
            if want is not None:
                ids = ids[:, [j for j, c in enumerate(part.cols.tolist()) if c in want]]
            (part.model.freeze if hold else part.model.thaw)(ids.reshape(-1))

    def held(self, groups: I64) -> set[str]:
        """The metrics whose models are frozen (`hold`) in every one of these groups."""
        groups = np.asarray(groups, dtype=np.int64)
        out: set[str] = set()
        for part in self._parts:
            frozen = part.model.frozen(part.ids(groups).reshape(-1)).reshape(groups.size, -1)
            out |= {self.columns[c] for j, c in enumerate(part.cols.tolist()) if frozen[:, j].all()}
        return out

    def forget_streams(self, streams: I64) -> None:
        """Reset released streams' saturation state, so that their rows can be reused."""
        streams = np.asarray(streams, dtype=np.int64)
        self._calm[:, streams[streams < self._calm.shape[1]]] = 0.0

    def inherit(self, src: I64, dst: I64) -> None:
        """New groups `dst` start from what groups `src` learned (every column's model)."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        if not src.size:
            return
        for part in self._parts:
            part.model.reserve((int(max(src.max(), dst.max())) + 1) * part.cols.size)
            part.model.copy(part.ids(src).reshape(-1), part.ids(dst).reshape(-1))

    def forget(self, groups: I64) -> None:
        """Reset released groups' models (every column's), so that their ids can be reused."""
        groups = np.asarray(groups, dtype=np.int64)
        if groups.size:
            for part in self._parts:
                ids: I64 = groups[:, None] * part.cols.size + np.arange(part.cols.size)
                part.model.reset(ids.reshape(-1))

    def snapshot(self) -> dict[int, bytes]:
        """Each column's models as a `LoadModel` of its own (the checkpoint format), and
        the streams' saturation state under `CALM_KEY` and `SHORT_KEY`."""
        out: dict[int, bytes] = {}
        for part in self._parts:
            out.update(part.snapshot())
        out = dict(sorted(out.items()))
        if self._saturates:
            out[CALM_KEY] = self._calm[:3].astype("<f8").tobytes()  # (3, streams), row-major
            out[SHORT_KEY] = self._calm[3].astype("<f8").tobytes()
        return out

    def restore(self, blobs: dict[int, bytes]) -> None:
        """Load column models saved by `snapshot` (by this class or its per-column form);
        without calm shares (an older checkpoint) every group's is learnt afresh."""
        for part in self._parts:
            part.restore(blobs)
        calm = blobs.get(CALM_KEY)
        if calm is None:
            self._calm = np.zeros((4, 16))
            return
        counts = np.frombuffer(calm, "<f8").reshape(3, -1)
        short = blobs.get(SHORT_KEY)
        # An older checkpoint: a stream's calm windows stand in for those short of full
        # (never fewer), so a stream withheld before is withheld until it shows otherwise.
        row = counts[1] if short is None else np.frombuffer(short, "<f8")
        self._calm = np.vstack([counts, row])
