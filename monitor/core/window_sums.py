"""Per (group, window) sums that wait for their window to be complete.

An aggregate (a pool's mean) is one sample per window of its group. A batch boundary
can fall inside a window (a Kafka fetch does not stop at one), and a sample taken from
the part of a window in one batch and another from the rest in the next is two noisy
samples where there is one: the detector would see time run twice as fast and a
variance that is not the aggregate's. So each group's newest window is held while it
may still grow, and its sums carry over into the next batch.

A window is complete once as many entries came for it as the group had in one window
(a pool of 8 devices: 8), or once a later window of the group arrives (a member went
silent; then the group counts as that much smaller). Entries for a window already
given out are left out of the aggregates (they still count on their own streams).
Held sums live beside the stream table and are not checkpointed: after a restart the
first window may be partial.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from monitor.arrays import F64, I64, Bools, grown


@dataclass(slots=True)
class _Held:
    ts: float
    sums: F64
    counts: F64
    n: int


@dataclass(slots=True)
class OpenWindows:
    """Each group's newest window while it may still grow, and what was given out."""

    members: F64 = field(default_factory=lambda: np.zeros(0))  # most entries in one window
    closed: F64 = field(default_factory=lambda: np.full(0, -np.inf))  # newest given out
    held: dict[int, _Held] = field(default_factory=dict)

    def take(self, groups: I64, ts: F64, values: F64) -> tuple[I64, F64, F64, F64]:
        """(group, ts, sums, counts) of the windows complete with this batch's entries,
        NaN ignored per column; each group's windows in time order."""
        k = values.shape[1]
        keep = self._fresh(groups, ts)
        gid, gts, sums, counts, n = _sums(groups[keep], ts[keep], values[keep])
        out = self._merge_held(gid, gts, sums, counts, n)
        if gid.size:
            np.maximum.at(self.members, gid, n)
            # The newest window of each group in the batch (sorted by group, then ts) may
            # still grow; an older one is over.
            newest = np.r_[gid[1:] != gid[:-1], True]
            done = ~newest | (n >= self.members[gid])
            for i in np.flatnonzero(~done).tolist():
                self.held[int(gid[i])] = _Held(float(gts[i]), sums[i].copy(), counts[i].copy(),
                                               int(n[i]))  # fmt: skip
            out.append((gid[done], gts[done], sums[done], counts[done]))
            np.maximum.at(self.closed, gid[done], gts[done])
        if not out:
            return np.empty(0, dtype=np.int64), np.empty(0), np.empty((0, k)), np.empty((0, k))
        g, t, s, c = zip(*out, strict=True)
        return np.concatenate(g), np.concatenate(t), np.concatenate(s), np.concatenate(c)

    def _fresh(self, groups: I64, ts: F64) -> Bools:
        """Entries newer than their group's last window given out and not older than its
        held one (the detector takes each group's windows once, in order)."""
        if not groups.size:
            return np.zeros(0, dtype=bool)
        top = int(groups.max()) + 1
        self.members = grown(self.members, top, 0.0)
        self.closed = grown(self.closed, top, -np.inf)
        floor = self.closed.copy()
        for g, h in self.held.items():
            if g < top:
                floor[g] = np.nextafter(h.ts, -np.inf)
        out: Bools = ts > floor[groups]
        return out

    def _merge_held(
        self, gid: I64, gts: F64, sums: F64, counts: F64, n: I64
    ) -> list[tuple[I64, F64, F64, F64]]:
        """Add held windows into this batch's part of them (in place), or give them out as
        they are where the group moved on to a later window."""
        out: list[tuple[I64, F64, F64, F64]] = []
        if not self.held:
            return out
        # This batch's windows of each held group: a slice of `gid` (sorted by group).
        held = np.fromiter(self.held, dtype=np.int64, count=len(self.held))
        starts = np.searchsorted(gid, held, "left").tolist()
        ends = np.searchsorted(gid, held, "right").tolist()
        for g, lo, hi in zip(held.tolist(), starts, ends, strict=True):
            h = self.held[g]
            same = np.flatnonzero(gts[lo:hi] == h.ts)
            if same.size:
                at = lo + int(same[0])
                sums[at] += h.sums
                counts[at] += h.counts
                n[at] += h.n
            elif hi > lo:  # only later windows came: this one is over
                out.append((np.array([g]), np.array([h.ts]), h.sums[None, :], h.counts[None, :]))
                self.closed[g] = h.ts
                # The group has this many members now (one left): later windows of that
                # size are complete, not each held a batch.
                self.members[g] = h.n
            else:
                continue
            del self.held[g]
        return out

    def forget(self, gids: I64 | list[int]) -> None:
        """Groups let go of (their ids may be reused)."""
        for g in np.asarray(gids, dtype=np.int64).tolist():
            self.held.pop(g, None)
            if g < self.members.size:
                self.members[g] = 0.0
                self.closed[g] = -np.inf


def _sums(groups: I64, ts: F64, values: F64) -> tuple[I64, F64, F64, F64, I64]:
    """Per unique (group, ts), sorted by group then ts: sums and finite counts per column
    (NaN ignored), and how many entries."""
    k = values.shape[1]
    if groups.size == 0:
        e = np.empty(0)
        return np.empty(0, dtype=np.int64), e, np.empty((0, k)), np.empty((0, k)), e.astype(int)
    win, t_idx = np.unique(ts, return_inverse=True)
    key = groups.astype(np.int64) * win.size + t_idx.reshape(-1)
    ukey, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)
    m = ukey.size
    ok = np.isfinite(values)
    clean = np.where(ok, values, 0.0)
    sums = np.empty((m, k))
    counts = np.empty((m, k))
    for c in range(k):  # a few columns; bincount beats ufunc.at by ~10x
        sums[:, c] = np.bincount(inv, weights=clean[:, c], minlength=m)
        counts[:, c] = np.bincount(inv, weights=ok[:, c], minlength=m)
    n = np.bincount(inv, minlength=m).astype(np.int64)
    return ukey // win.size, win[ukey % win.size], sums, counts, n
