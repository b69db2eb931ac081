"""Load-aware expectations: vectorised recursive least squares, one model per group.

MFU and stall move with batch size and request rate. A `LoadModel` keeps one
linear model ``y ≈ theta · [1, features]`` per group (pool × layer type, say)
and returns, for every sample, the expected value *before* learning from it,
so ``y - expected`` is an honest residual. The detector then runs on
residuals: a traffic burst moves the expectation with it and is not a change,
while a regression that shows only under burst load leaves a residual. Feed
the detector ``y / expected`` (about 1.0 at any load, so `min_rel_change` reads
as "relative to what this load should give"), or ``y - expected`` with an
absolute effect gate where the metric can be near zero.

Estimation is exponentially weighted least squares in information form
(``A = lam*A + sum w x x^T``, ``b = lam*b + sum w x y``, forgetting once per
call for the groups a call touches), so many samples of one group in one call
are exact, not an approximation, and every group's solve is one batched
``np.linalg.solve``. Guards against learning a regression away: residuals are
clipped at `clip` robust sigmas before they are learned from (a step is
absorbed only slowly), and `freeze` / `thaw` or a per-sample `weight` let the
pipeline stop learning for groups whose residuals are alarming.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from monitor.arrays import F64, I64, Bools
from monitor.detect import _blob

_ABS_TO_SIGMA = 1.2533  # sigma / E|r| for Gaussian residuals


class LoadModel:
    """Per-group exponentially weighted least squares of a metric on load features."""

    kind: ClassVar[str] = "load_model"
    # Per-group state arrays (leading axis: group).
    _ARRAYS: ClassVar[tuple[str, ...]] = (
        "_a", "_b", "_theta", "_seen", "_frozen", "_rabs", "_level",
    )  # fmt: skip

    def __init__(
        self,
        n_features: int,
        *,
        forget: float = 0.99,
        ridge: float = 1e-6,
        intercept: bool = True,
        warmup: int | None = None,
        clip: float = 4.0,
        capacity: int = 16,
        jitter: tuple[float, ...] = (),
    ) -> None:
        if n_features < 0 or not 0 < forget <= 1 or ridge < 0 or clip <= 0:
            raise ValueError("n_features >= 0, 0 < forget <= 1, ridge >= 0, clip > 0 required")
        self.n_features = int(n_features)
        self.intercept = bool(intercept)
        self.p = self.n_features + int(self.intercept)
        if self.p == 0:
            raise ValueError("a model needs an intercept or at least one feature")
        self.forget, self.ridge, self.clip = float(forget), float(ridge), float(clip)
        # Per feature: how far apart two samples' values may lie and still be the same load
        # (a reporting floor; 0: exact). Each sample adds its square to that feature's
        # diagonal, as if its value were known only that closely: spread within it teaches
        # no slope, and a call within it of what was seen is no new load (`support`).
        self.jitter = tuple(float(j) for j in jitter) + (0.0,) * (n_features - len(jitter))
        if len(self.jitter) != self.n_features or min(self.jitter, default=0.0) < 0:
            raise ValueError("one jitter >= 0 per feature at most")
        self._jitter2 = np.array(
            [0.0] * int(self.intercept) + [j * j for j in self.jitter], dtype=np.float64
        )
        self.warmup = 4 * self.p if warmup is None else int(warmup)
        self._cap = 0
        self._a = np.zeros((0, self.p, self.p))
        self._b = np.zeros((0, self.p))
        self._theta = np.zeros((0, self.p))
        self._seen = np.zeros(0, dtype=np.int64)  # samples learned from
        self._frozen = np.zeros(0, dtype=np.bool_)
        self._rabs = np.zeros(0)  # EW mean |residual| (0 = not yet known)
        self._level = np.full(0, np.nan)  # EW mean of y
        self._grow(max(int(capacity), 1))

    # -- state ------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Number of group slots currently allocated."""
        return self._cap

    def _grow(self, need: int) -> None:
        if need <= self._cap:
            return
        cap, old = max(need, 2 * self._cap), self._cap

        def ext(arr: np.ndarray, fill: Any) -> np.ndarray:
            out = np.full((cap, *arr.shape[1:]), fill, dtype=arr.dtype)
            out[:old] = arr
            return out

        self._a, self._b, self._theta = ext(self._a, 0.0), ext(self._b, 0.0), ext(self._theta, 0.0)
        self._seen, self._frozen = ext(self._seen, 0), ext(self._frozen, False)
        self._rabs, self._level = ext(self._rabs, 0.0), ext(self._level, np.nan)
        self._cap = cap

    def reserve(self, n_groups: int) -> None:
        """Make room for group ids below `n_groups` (capacity doubles, as on demand)."""
        self._grow(int(n_groups))

    def _params(self) -> dict[str, Any]:
        return {
            "forget": self.forget, "ridge": self.ridge, "intercept": self.intercept,
            "warmup": self.warmup, "clip": self.clip, "jitter": list(self.jitter),
        }  # fmt: skip

    def take_slots(self, slot: int, stride: int) -> LoadModel:
        """The models of groups ``slot, slot + stride, ...`` as a model of their own (copies);
        the capacity must be a multiple of `stride`."""
        if self._cap % stride:
            raise ValueError("capacity must be a multiple of the stride")
        out = LoadModel(self.n_features, capacity=1, **self._params())
        for name in self._ARRAYS:
            setattr(out, name, getattr(self, name)[slot::stride].copy())
        out._cap = self._cap // stride
        return out

    @classmethod
    def interleave(cls, parts: dict[int, LoadModel], stride: int, **defaults: Any) -> LoadModel:
        """One model whose group ``g * stride + slot`` is group g of ``parts[slot]``; slots
        without a part (or groups past a part's capacity) start fresh."""
        n_features = int(defaults.pop("n_features", 3))
        if not parts:
            return cls(n_features, capacity=16 * stride, **defaults)
        first = next(iter(parts.values()))
        groups = max(p._cap for p in parts.values())
        # The jitter is the caller's (a reporting floor, not something learned).
        params = {**first._params(), "jitter": defaults.get("jitter", first.jitter)}
        out = cls(first.n_features, capacity=groups * stride, **params)
        for slot, part in parts.items():
            for name in cls._ARRAYS:
                getattr(out, name)[slot : part._cap * stride : stride] = getattr(part, name)
        return out

    def _design(self, features: F64, n: int) -> F64:
        feats = np.asarray(features, dtype=np.float64).reshape(n, self.n_features)
        if not self.intercept:
            return feats
        return np.concatenate([np.ones((n, 1)), feats], axis=1)

    # -- queries ------------------------------------------------------------------
    def predict(self, groups: I64, features: F64) -> F64:
        """Expected y under the current coefficients; NaN while a group is warming up."""
        groups = np.asarray(groups, dtype=np.int64)
        if groups.size and int(groups.min()) < 0:
            raise ValueError("group ids must be >= 0")
        self._grow(int(groups.max()) + 1 if groups.size else 0)
        return self._predict(groups, self._design(features, groups.size))

    def _predict(self, groups: I64, x: F64) -> F64:
        """`predict` on design rows `x` (groups within the capacity)."""
        expected = _dot(x, self._theta[groups])
        expected[self._seen[groups] < self.warmup] = np.nan
        return expected

    def coef(self, groups: I64) -> F64:
        """Coefficients [intercept, features...] per group (a copy)."""
        return self._theta[np.asarray(groups, dtype=np.int64)].copy()

    def support(self, groups: I64, features: F64) -> F64:
        """Per sample: how many calls' worth of data the model holds at its group's mean load.

        One over the leverage of the group's mean design row in this call, in units of the
        group's samples in this call: about the model's memory in steady load, about 1 the
        first time the load moves somewhere new (a burst). Predictions there extrapolate.
        """
        groups = np.asarray(groups, dtype=np.int64)
        n = groups.size
        if n == 0:
            return np.zeros(0)
        self._grow(int(groups.max()) + 1)
        x = self._design(features, n)
        touched, inv, count_i = _segments(groups, self._cap)
        count = count_i.astype(np.float64)
        sums = np.stack([np.bincount(inv, x[:, j]) for j in range(self.p)], axis=1)
        x_mean: F64 = sums / count[:, None]
        a_reg = self._regularised(self._a[touched])
        lev = np.einsum("gp,gp->g", x_mean, np.linalg.solve(a_reg, x_mean[:, :, None])[:, :, 0])
        out: F64 = 1.0 / np.maximum(lev * count, 1e-300)
        return out[inv]

    def _regularised(self, a: F64) -> F64:
        """Levenberg-style ridge: relative to each diagonal, so feature units do not matter."""
        diag = np.einsum("gii->gi", a)
        reg = self.ridge * diag + 1e-12 * (1.0 + diag.max(axis=1, keepdims=True))
        out: F64 = a + reg[:, :, None] * np.eye(self.p)
        return out

    def reset(self, groups: I64) -> None:
        """Reset these groups to fresh models, so that their ids can be reused."""
        groups = np.asarray(groups, dtype=np.int64)
        groups = groups[(groups >= 0) & (groups < self._cap)]
        self._a[groups], self._b[groups], self._theta[groups] = 0.0, 0.0, 0.0
        self._seen[groups], self._frozen[groups] = 0, False
        self._rabs[groups], self._level[groups] = 0.0, np.nan

    def copy(self, src: I64, dst: I64) -> None:
        """Groups `dst` start as copies of groups `src` (what each has learned), unfrozen."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        if not src.size:
            return
        self._grow(int(max(src.max(), dst.max())) + 1)
        for name in self._ARRAYS:
            arr = getattr(self, name)
            arr[dst] = arr[src]
        self._frozen[dst] = False

    # -- learning ---------------------------------------------------------------------
    def freeze(self, groups: I64) -> None:
        """Stop learning for these groups (e.g. while their incident pages)."""
        groups = np.asarray(groups, dtype=np.int64)
        if groups.size:
            self._grow(int(groups.max()) + 1)
            self._frozen[groups] = True

    def frozen(self, groups: I64) -> Bools:
        """Whether each of these groups is frozen."""
        groups = np.asarray(groups, dtype=np.int64)
        out: Bools = (groups < self._cap) & self._frozen[np.minimum(groups, self._cap - 1)]
        return out

    def thaw(self, groups: I64) -> None:
        """Resume learning for these groups."""
        groups = np.asarray(groups, dtype=np.int64)
        self._frozen[groups[groups < self._cap]] = False

    def update(
        self, groups: I64, features: F64, y: F64, weight: F64 | None = None,
        unclipped: Bools | None = None,
    ) -> F64:  # fmt: skip
        """Expected y for each sample (before learning from it), then learn from the call.

        A group may occur many times in one call. Samples with NaN y or features, weight
        0, or a frozen group are predicted but not learned from. `unclipped` samples are
        learned from at full residual (`learn_grid`'s `trust`).
        """
        groups = np.asarray(groups, dtype=np.int64)
        n = groups.size
        if n == 0:
            return self.predict(groups, features)
        if int(groups.min()) < 0:
            raise ValueError("group ids must be >= 0")
        self._grow(int(groups.max()) + 1)
        x = self._design(features, n)
        expected = self._predict(groups, x)
        y = np.asarray(y, dtype=np.float64).reshape(n)
        w = np.ones(n) if weight is None else np.asarray(weight, dtype=np.float64).reshape(n)
        free = np.zeros(n, dtype=bool) if unclipped is None else np.asarray(unclipped, dtype=bool)
        ok = np.isfinite(y) & np.isfinite(x).all(axis=1) & np.isfinite(w) & (w > 0)
        ok &= ~self._frozen[groups]
        if not ok.all():  # the usual call learns from every sample: no copies then
            if not ok.any():
                return expected
            groups, x, y, w, free = groups[ok], x[ok], y[ok], w[ok], free[ok]
        g = groups
        raw = np.einsum("np,np->n", x, self._theta[g])
        resid = y - raw
        # Learn from clipped residuals: one burst of outliers, or a fresh regression,
        # moves the coefficients by at most `clip` robust sigmas' worth per sample.
        bound = self.clip * self._rabs[g] * _ABS_TO_SIGMA
        warm = (self._seen[g] >= self.warmup) & (bound > 0)
        resid = np.where(warm, np.clip(resid, -bound, bound), resid)
        y_eff = np.where(free, y, raw + resid)

        touched, _, counts = _segments(g, self._cap)
        order = _stable_order(g, self._cap)
        starts = np.r_[0, np.cumsum(counts[:-1])]
        # Sample-major columns (one contiguous row per product), so that each group's sums
        # are contiguous runs: reduceat over a (n, p, p) array on axis 0 costs ~40x more,
        # for the same sums (reduceat adds a run in one pass, whatever the layout).
        xs, ws = np.ascontiguousarray(x[order].T), w[order]
        xws = xs * ws
        p = self.p
        xtx = np.add.reduceat(
            (xws[:, None, :] * xs[None, :, :]).reshape(p * p, -1), starts, axis=1
        ).T.reshape(-1, p, p)
        xty = np.add.reduceat(xws * y_eff[order], starts, axis=1).T
        wsum = np.add.reduceat(ws, starts)
        # Residual scale and level: EW per call, weighted means within the call.
        mean_abs = np.add.reduceat(ws * np.abs(resid[order]), starts) / wsum
        mean_y = np.add.reduceat(ws * y[order], starts) / wsum
        self._fold(touched, xtx, xty, mean_abs, mean_y, counts)
        return expected

    def _fold(self, ids: I64, xtx: F64, xty: F64, mean_abs: F64, mean_y: F64, counts: I64) -> None:
        """One call's sums into models `ids`: forget once, add, re-solve, track scale and level."""
        lam = self.forget
        a = lam * self._a[ids] + xtx
        if self._jitter2.any():
            a += counts.astype(np.float64)[:, None, None] * np.diag(self._jitter2)
        b = lam * self._b[ids] + xty
        self._a[ids], self._b[ids] = a, b
        self._theta[ids] = np.linalg.solve(self._regularised(a), b[:, :, None])[:, :, 0]
        known = self._rabs[ids] > 0
        self._rabs[ids] = np.where(known, lam * self._rabs[ids] + (1 - lam) * mean_abs, mean_abs)
        lvl = self._level[ids]
        self._level[ids] = np.where(np.isfinite(lvl), lam * lvl + (1 - lam) * mean_y, mean_y)
        self._seen[ids] += counts

    def complete(self, groups: I64, stride: int, features: F64, y: F64) -> bool:
        """Whether `learn_grid` may take this grid: every sample learnable, none frozen."""
        ids = groups[:, None] * stride + np.arange(stride)
        frozen = self._frozen[ids[ids < self._cap]]
        return bool(np.isfinite(y).all() and np.isfinite(features).all() and not frozen.any())

    def learn_grid(
        self, groups: I64, stride: int, features: F64, y: F64, *, support: bool,
        trust: float = 0.0,
    ) -> tuple[F64 | None, F64]:  # fmt: skip
        """(support, expected) per sample of a complete grid, then learn from it.

        Samples whose support is under `trust` (needs `support`) are learned from at full
        residual: there the residual is the model's ignorance of that load, not the
        device's, and clipping it would leave the model wrong at that load for as long
        as its memory (a pool's first burst read as a shift on every device).

        The grid must pass `complete` and hold at least one row. Sample (r, c) is model
        ``groups[r] * stride + c`` at design row r. The numbers are those of `support` and
        then `update` over the grid's samples in any order that keeps each model's rows in
        row order, bit for bit: the same sums of the same values in the same order. A
        group's models share their rows, so the sums that depend on the design alone are
        made once per group instead of once per model.
        """
        groups = np.asarray(groups, dtype=np.int64)
        c, p = int(stride), self.p
        if int(groups.min()) < 0:
            raise ValueError("group ids must be >= 0")
        n_groups = int(groups.max()) + 1
        self._grow(n_groups * c)
        x = self._design(features, groups.size)
        fam, pos, counts = _segments(groups, n_groups)
        order = _stable_order(groups, n_groups)
        starts = np.r_[0, np.cumsum(counts[:-1])]
        flat = (fam[:, None] * c + np.arange(c)).reshape(-1)  # touched models, ascending
        sid = groups[:, None] * c + np.arange(c)  # each sample's model
        sup = None
        if support:
            sup = self._grid_support(x, pos, counts, flat, c)[pos[:, None] * c + np.arange(c)]
        th = self._theta[sid]
        expected = _dot(x[:, None, :], th)
        seen = self._seen[sid]
        expected[seen < self.warmup] = np.nan
        raw = np.einsum("rcp,rcp->rc", np.broadcast_to(x[:, None, :], th.shape), th)
        resid = y - raw
        bound = self.clip * self._rabs[sid] * _ABS_TO_SIGMA
        warm = (seen >= self.warmup) & (bound > 0)
        resid = np.where(warm, np.clip(resid, -bound, bound), resid)
        y_eff = raw + resid
        if sup is not None and trust > 0:
            y_eff = np.where(sup < trust, y, y_eff)
        # Rows grouped by group, one contiguous row per feature or column (`update`).
        xs = np.ascontiguousarray(x[order].T)
        gram = np.add.reduceat((xs[:, None, :] * xs[None, :, :]).reshape(p * p, -1), starts, axis=1)
        xtx = np.repeat(gram.T.reshape(-1, p, p), c, axis=0)
        ye = np.ascontiguousarray(y_eff[order].T)
        xty = np.add.reduceat((ye[:, None, :] * xs[None, :, :]).reshape(c * p, -1), starts, axis=1)
        xty = xty.reshape(c, p, -1).transpose(2, 0, 1).reshape(-1, p)
        wsum = np.repeat(counts.astype(np.float64), c)
        runs = np.ascontiguousarray(np.abs(resid[order]).T)
        mean_abs = np.add.reduceat(runs, starts, axis=1).T.reshape(-1) / wsum
        runs = np.ascontiguousarray(y[order].T)
        mean_y = np.add.reduceat(runs, starts, axis=1).T.reshape(-1) / wsum
        self._fold(flat, xtx, xty, mean_abs, mean_y, np.repeat(counts, c))
        return sup, expected

    def _grid_support(self, x: F64, pos: I64, counts: I64, flat: I64, c: int) -> F64:
        """`support` per model of a complete grid (`learn_grid`'s `flat` order)."""
        count = np.repeat(counts.astype(np.float64), c)
        sums = np.stack([np.bincount(pos, x[:, j]) for j in range(self.p)], axis=1)
        x_mean: F64 = np.repeat(sums, c, axis=0) / count[:, None]
        a_reg = self._regularised(self._a[flat])
        lev = np.einsum("gp,gp->g", x_mean, np.linalg.solve(a_reg, x_mean[:, :, None])[:, :, 0])
        out: F64 = 1.0 / np.maximum(lev * count, 1e-300)
        return out

    # -- checkpoints ------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """All state and parameters as deterministic bytes."""
        params = {"n_features": self.n_features, **self._params(), "groups": self._cap}
        arrays: dict[str, npt.NDArray[Any]] = {
            name.lstrip("_"): getattr(self, name) for name in self._ARRAYS
        }
        return _blob.pack(self.kind, params, arrays)

    @classmethod
    def restore(cls, blob: bytes) -> LoadModel:
        """Rebuild from `snapshot` bytes; future outputs are identical."""
        params, arr = _blob.unpack(blob, cls.kind)
        groups = int(params.pop("groups"))
        model = cls(int(params.pop("n_features")), capacity=1, **params)
        for name in cls._ARRAYS:
            setattr(model, name, arr[name.lstrip("_")])
        model._cap = groups
        return model


def _segments(groups: I64, cap: int) -> tuple[I64, I64, I64]:
    """(touched groups ascending, each sample's index into them, samples per group).

    What ``np.unique(groups, return_inverse=True)`` gives, by counting instead of sorting
    (ids are below `cap`).
    """
    per_id = np.bincount(groups, minlength=cap)
    touched = np.flatnonzero(per_id)
    pos = np.empty(per_id.size, dtype=np.int64)
    pos[touched] = np.arange(touched.size)
    return touched, pos[groups], per_id[touched]


def _dot(x: F64, coef: F64) -> F64:
    """``(x * coef).sum(axis=-1)``, the same additions in the same order, but faster.

    Under 8 terms numpy adds from +0.0 left to right; so does this, without numpy's fixed
    cost per output of reducing a short axis (about 6x the time at 4 terms).
    """
    prod = x * coef
    p = prod.shape[-1]
    if p >= 8:  # numpy adds 8 or more terms pairwise
        total: F64 = prod.sum(axis=-1)
        return total
    out: F64 = prod[..., 0] + 0.0
    for j in range(1, p):
        out += prod[..., j]
    return out


def _stable_order(groups: I64, cap: int) -> I64:
    """Samples grouped by id, in call order within each group (a stable argsort)."""
    # Ids that fit in 16 bits sort by radix, several times faster than a merge sort.
    key = groups.astype(np.uint16) if cap <= 1 << 16 else groups
    order: I64 = np.argsort(key, kind="stable")
    return order
