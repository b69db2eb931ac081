"""Load awareness: detect on `y / expected(y | load)` so a traffic burst is not a regression.

MFU, stall fraction, latency and queueing move with batch size and request
rate. For each load-sensitive column, one `LoadModel` per (pool, model, layer)
group learns the expectation from log(1 + batch), log(1 + req_rate) and 1 / batch; the
detector sees the ratio, about 1.0 at any load. A regression that shows only
under burst load still moves the ratio during bursts, so it is still caught.
Columns that are not load-driven (clock, temperature, kernel fallback, quality)
pass through unchanged. Where a group's model has under `min_support` windows of
data at the group's current load (a pool's first burst), the ratio would measure
the model's extrapolation error, so it is withheld (NaN) while the model learns.
"""

from __future__ import annotations

import numpy as np

from monitor.detect.base import F64, I64
from monitor.detect.load_model import LoadModel

# Load-driven columns; the rest are judged on their raw values.
LOAD_SENSITIVE = frozenset({
    "mfu", "stall_frac", "arith_intensity", "occupancy", "sync_frac",
    "device_mfu", "power_w", "lat_p50_ms", "lat_p95_ms", "lat_p99_ms",
    "queue_wait_ms", "queue_depth",
})  # fmt: skip


class LoadAdjuster:
    """Turns a wave's value matrix into load-normalised ratios, column by column."""

    def __init__(
        self, columns: tuple[str, ...], forget: float = 0.99, min_support: float = 0.0
    ) -> None:
        self.columns = columns
        self.min_support = float(min_support)
        self.extrapolated = 0  # samples withheld from detection: load outside the model's data
        self.models = {
            i: LoadModel(3, forget=forget) for i, m in enumerate(columns) if m in LOAD_SENSITIVE
        }

    def adjust(self, groups: I64, load: F64, values: F64) -> tuple[F64, F64]:
        """(ratios, expected): NaN ratio while a group's model warms up or expects <= 0."""
        known = np.nan_to_num(load, nan=0.0)
        # log terms for throughput scaling, 1/batch for fixed per-step overheads that
        # amortise away as batches grow (MFU flattens out at large batch).
        feats = np.column_stack([np.log1p(known), 1.0 / np.maximum(known[:, 0], 1.0)])
        ratios = values.copy()
        expected = np.ones_like(values)
        for col, model in self.models.items():
            y = values[:, col]
            ok = np.isfinite(y)
            exp = np.full(y.shape, np.nan)
            if ok.any():
                g, f = groups[ok], feats[ok]
                # The first windows at a load the model has not seen (a pool's first burst)
                # are extrapolation: the ratio would measure the model's error, not the
                # device. Withhold them from detection (NaN) but learn from them (support is
                # taken before learning). A frozen group (its incident is paging) cannot
                # learn, so withholding would last until it thaws: it keeps extrapolating,
                # as before, and the lifecycle's recovery check already discounts that.
                novel = None
                if self.min_support > 0:
                    novel = (model.support(g, f) < self.min_support) & ~model.frozen(g)
                exp_ok = model.update(g, f, y[ok])
                if novel is not None:
                    novel &= np.isfinite(exp_ok)
                    exp_ok[novel] = np.nan
                    self.extrapolated += int(novel.sum())
                exp[ok] = exp_ok
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios[:, col] = np.where(exp > 0, y / exp, np.nan)
            expected[:, col] = exp
        return ratios, expected

    def hold(self, groups: I64, *, hold: bool) -> None:
        """Stop (or resume) learning for these groups in every column's model."""
        for model in self.models.values():
            (model.freeze if hold else model.thaw)(groups)

    def snapshot(self) -> dict[int, bytes]:
        """Each column model's bytes."""
        return {c: m.snapshot() for c, m in self.models.items()}

    def restore(self, blobs: dict[int, bytes]) -> None:
        """Load column models saved by `snapshot`."""
        self.models = {c: LoadModel.restore(b) for c, b in blobs.items()}
