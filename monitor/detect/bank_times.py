"""The bank's time ring: each ring slot's window time, held once per stream where it can be.

A cell's ring slot holds a sample and the time of the window it came from (float32
seconds since the detector's epoch); alarms read the times for onsets. The cells of one
stream (row) take their samples in the same waves, so their time rings are one ring k
times over, perhaps rotated (a metric that first came some windows after the others
writes its ring from slot 0 while theirs are further on) and with the slots it has not
written yet empty. `TimeRings` holds one ring per row, with its own position `rpos`, and
per cell a code (`own`) saying how its ring follows the row's:

- `FOLLOW` (0): it is the row's ring;
- `EMPTY` (-1): every slot NaN (never written since the row started: a metric the stream
  does not send costs no ring);
- -2 - (d * (hist + 1) + fill): slot j is the row's slot j + d, for the `fill` slots it
  wrote last; the others are NaN (it was EMPTY when it joined);
- c >= 1: a ring of its own, column c - 1 of `store`: it missed a wave its row took.

Checkpoints and `columns` see one ring per cell, bit for bit what a ring per cell held.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from monitor.arrays import F32, F64, I64

FOLLOW, EMPTY = 0, -1
# float32 NaN as `np.nan` stores it: an EMPTY ring and unwritten slots are these bits.
_NAN32 = np.float32(np.nan)
_NAN_BITS = _NAN32.view(np.uint32)

Zeros = Callable[[tuple[int, ...], type[np.generic]], np.ndarray]
_Mask = npt.NDArray[np.bool_]


class TimeRings:
    """The time rings of a bank with `k` cells per row and rings of `hist` slots."""

    __slots__ = ("free", "hist", "irregular", "k", "own", "rows", "rpos", "store", "used",
                 "zeros")  # fmt: skip

    def __init__(self, hist: int, k: int, zeros: Zeros) -> None:
        self.hist, self.k, self.zeros = hist, k, zeros
        self.rows: F32 = np.zeros((hist, 0), dtype=np.float32)  # per row
        self.rpos = np.zeros(0, dtype=np.int32)  # per row: next slot
        self.own = np.zeros(0, dtype=np.int32)  # per cell: the code above
        self.store: F32 = np.zeros((hist, 0), dtype=np.float32)
        self.free: list[int] = []  # store columns to reuse
        self.used = 0  # store columns handed out (free ones included)
        self.irregular = 0  # cells whose code is not FOLLOW: 0 makes a wave one write per row

    # -- capacity --------------------------------------------------------------------
    def reserve(self, cap: int, rows_used: int) -> None:
        """Room for `cap` rows, keeping the first `rows_used`."""
        rows = self.zeros((self.hist, cap), np.float32)
        rows[:, :rows_used] = self.rows[:, :rows_used]
        rpos = self.zeros((cap,), np.int32)
        rpos[:rows_used] = self.rpos[:rows_used]
        own = self.zeros((cap * self.k,), np.int32)
        own[: rows_used * self.k] = self.own[: rows_used * self.k]
        self.rows, self.rpos, self.own = rows, rpos, own

    def grow(self, lo: int, hi: int) -> None:
        """Rows `lo:hi` handed out: no times yet."""
        self.rows[:, lo:hi] = np.nan

    def forget(self, rows: I64) -> None:
        """Expired rows start again: no times, every cell following its row."""
        rows = np.unique(rows)  # a store column must go back to `free` once
        self.rows[:, rows] = np.nan
        self.rpos[rows] = 0
        if not self.irregular:
            return
        cells = (rows[:, None] * self.k + np.arange(self.k)).ravel()
        own = self.own[cells]
        off = own != FOLLOW
        if off.any():
            self.free.extend((own[own > 0] - 1).tolist())
            self.irregular -= int(np.count_nonzero(off))
            self.own[cells] = FOLLOW

    def _alloc(self, n: int) -> I64:
        """`n` store columns (reused first)."""
        take = min(n, len(self.free))
        got = [self.free.pop() for _ in range(take)]
        fresh = n - take
        if self.used + fresh > self.store.shape[1]:
            cap = max(self.used + fresh, 2 * self.store.shape[1], 1024)
            store = self.zeros((self.hist, cap), np.float32)
            store[:, : self.used] = self.store[:, : self.used]
            self.store = store
        new = np.arange(self.used, self.used + fresh, dtype=np.int64)
        self.used += fresh
        return np.concatenate([np.array(got, dtype=np.int64), new])

    def _keep(self, cells: I64, cols: F32) -> None:
        """`cells` (not following) hold the rings `cols`: EMPTY if all NaN, else stored."""
        was = self.own[cells]
        self.irregular += int(np.count_nonzero(was == FOLLOW))
        mine = was > 0
        if mine.any():
            self.free.extend((was[mine] - 1).tolist())
        empty = (cols.view(np.uint32) == _NAN_BITS).all(axis=0)
        self.own[cells[empty]] = EMPTY
        if not empty.all():
            full = ~empty
            at = self._alloc(int(np.count_nonzero(full)))
            self.store[:, at] = cols[:, full]
            self.own[cells[full]] = (at + 1).astype(np.int32)

    # -- hot path ----------------------------------------------------------------------
    def take(self, rows: I64, present: _Mask | None, pos: np.ndarray, t: F64) -> None:
        """One wave: `rows` (each once) with their cells' presence (n, k) (None: all
        present), ring positions before the wave (n, k), and each row's time `t`.

        A row takes the wave when a cell following it is present: its ring gets the time.
        Its following cells that are absent keep their rings (`_keep`); EMPTY cells that
        are present join it, rotated; the others write their own rings.
        """
        if not self.irregular:
            self._take_plain(rows, present, pos, t)
            return
        cells = rows[:, None] * self.k + np.arange(self.k)
        code = self.own[cells]
        fol = code <= 0
        fol &= code != EMPTY
        if present is None:
            live = np.any(fol, axis=1)
            here = np.broadcast_to(True, code.shape)
        else:
            here = present
            fol_here = fol & here
            live = np.any(fol_here, axis=1)
            gone = fol ^ fol_here  # following and absent
            gone &= live[:, None]
            if gone.any():
                self._keep(cells[gone], self._decode(cells[gone], pos[gone]))
                code[gone] = self.own[cells[gone]]
        empty = code == EMPTY
        empty &= here
        if empty.any():
            self._start(rows, cells, code, empty, live, pos)
        if self.used:
            mine = (code > 0) & here
            if mine.any():
                flat = pos[mine].astype(np.int64) * self.store.shape[1]
                flat += code[mine] - 1
                self.store.reshape(-1)[flat] = np.broadcast_to(t[:, None], code.shape)[mine]
        filling = code <= -2
        filling &= here
        if filling.any():
            self._filled(cells[filling], code[filling])
        self._advance(rows[live], t[live])

    def _take_plain(self, rows: I64, present: _Mask | None, pos: np.ndarray, t: F64) -> None:
        """`take` while every cell plainly follows its row."""
        if present is not None:
            live = np.any(present, axis=1)
            gone = ~present & live[:, None]
            if gone.any():
                cells = (rows[:, None] * self.k + np.arange(self.k))[gone]
                self._keep(cells, self._decode(cells, pos[gone]))
            if not live.all():
                rows, t = rows[live], t[live]
        self._advance(rows, t)

    def _start(self, rows: I64, cells: I64, code: np.ndarray, empty: _Mask, live: _Mask,
               pos: np.ndarray) -> None:  # fmt: skip
        """EMPTY cells present in the wave (`empty`): those whose row takes it join the row's
        ring, rotated; the others get a ring of their own. Updates `code` and `own`."""
        h = self.hist
        join = empty & live[:, None]
        if join.any():
            # Slot j of the cell is slot j + d of the row from now on: both advance together.
            # None of its slots is written yet (fill 0; this wave's is counted by `_filled`).
            d = (self.rpos[rows][:, None] - pos) % h
            code[join] = -2 - d[join] * (h + 1)
        alone = empty & ~live[:, None]
        if alone.any():
            at = self._alloc(int(np.count_nonzero(alone)))
            self.store[:, at] = np.nan
            code[alone] = (at + 1).astype(np.int32)
        self.own[cells[empty]] = code[empty]

    def _filled(self, cells: I64, code: np.ndarray) -> None:
        """Rotated cells wrote one more slot; one whose ring is now the row's, unrotated and
        with every slot written, plainly follows it."""
        h = self.hist
        c = -2 - code
        more = c % (h + 1) < h  # rotated with every slot written: nothing changes
        if not more.any():
            return
        cells, c = cells[more], c[more] + 1
        done = c == h  # d 0 and fill h
        self.own[cells] = np.where(done, FOLLOW, -2 - c).astype(np.int32)
        self.irregular -= int(np.count_nonzero(done))

    def _advance(self, rows: I64, t: F64) -> None:
        """`rows` take the wave: each ring's next slot gets its time."""
        rp = self.rpos[rows]
        flat = rp.astype(np.int64) * self.rows.shape[1]
        flat += rows
        self.rows.reshape(-1)[flat] = t.astype(np.float32)  # cast first: a casting store is slow
        rp += 1
        rp[rp == self.hist] = 0
        self.rpos[rows] = rp

    # -- reads -------------------------------------------------------------------------
    def _decode(self, cells: I64, pos: np.ndarray) -> F32:
        """The time rings of `cells` at ring positions `pos`, (hist, len(cells))."""
        r = cells // self.k
        out: F32 = self.rows[:, r]
        if not self.irregular:
            return out
        code = self.own[cells]
        empty = np.flatnonzero(code == EMPTY)
        out[:, empty] = np.nan
        mine = np.flatnonzero(code > 0)
        out[:, mine] = self.store[:, code[mine] - 1]
        rot = np.flatnonzero(code <= -2)
        if rot.size:
            h = self.hist
            c = -2 - code[rot].astype(np.int64)
            d, fill = c // (h + 1), c % (h + 1)
            j = np.arange(h)[:, None]
            vals = self.rows[(j + d) % h, r[rot]]
            written = (np.asarray(pos)[rot] - 1 - j) % h < fill
            out[:, rot] = np.where(written, vals, _NAN32)
        return out

    def columns(self, cells: I64, pos: np.ndarray) -> F32:
        """The time rings of `cells` (ring positions `pos`), (hist, len(cells))."""
        return self._decode(cells, pos)

    def full(self, n_rows: int, pos: np.ndarray) -> F32:
        """The time rings of every cell of the first `n_rows` rows, (hist, n_rows * k)."""
        if not self.irregular:
            return np.repeat(self.rows[:, :n_rows], self.k, axis=1)
        cells = np.arange(n_rows * self.k, dtype=np.int64)
        return self._decode(cells, pos[: cells.size])

    # -- epoch and checkpoints -----------------------------------------------------------
    def shift(self, by: float, n_rows: int) -> None:
        """Re-express every time `by` seconds later, as float32(float64(t) - by), in blocks
        (no full-size float64 copy). NaN stays the same NaN."""
        step = 1 << 16
        for arr, n in ((self.rows, n_rows), (self.store, self.used)):
            for a in range(0, n, step):
                blk = arr[:, a : min(a + step, n)]
                blk[...] = blk.astype(np.float64) - by

    @classmethod
    def load(cls, tring: F32, pos: np.ndarray, k: int, zeros: Zeros) -> TimeRings:
        """From a ring per cell (hist, rows * k) and the cells' ring positions: per row, the
        ring of the cell most others share (same position and times) becomes the row's;
        each other cell is coded as what reproduces its ring exactly."""
        h, n_cells = tring.shape
        n_rows = n_cells // k
        self = cls(h, k, zeros)
        self.reserve(max(n_rows, 1), 0)
        bits = tring.view(np.uint32)
        p = np.asarray(pos, dtype=np.int64)
        same = np.ones((n_rows, k, k), dtype=np.bool_)
        b3 = bits.reshape(h, n_rows, k)
        for s in range(h):
            same &= b3[s][:, :, None] == b3[s][:, None, :]
        p2 = p.reshape(n_rows, k)
        same &= p2[:, :, None] == p2[:, None, :]
        lead = same.sum(axis=2).argmax(axis=1)
        rix = np.arange(n_rows)
        self.rows[:, :n_rows] = tring.reshape(h, n_rows, k)[:, rix, lead]
        self.rpos[:n_rows] = p2[rix, lead]
        off = np.flatnonzero(~same[rix, lead].reshape(-1))
        if not off.size:
            return self
        r, pc = off // k, p[off]
        cb = bits[:, off]
        d = (self.rpos[r].astype(np.int64) - pc) % h
        j = np.arange(h)[:, None]
        back = (pc - 1 - j) % h  # slot written i waves ago, by row i
        rot = self.rows[(back + d) % h, r].view(np.uint32)
        mine = np.take_along_axis(cb, back, axis=0)
        eq = mine == rot
        run = np.where(eq.all(axis=0), h, eq.argmin(axis=0))  # slots it shares, newest first
        tail_nan = ((j >= run) <= (mine == _NAN_BITS)).all(axis=0)
        empty = (mine == _NAN_BITS).all(axis=0)
        rotated = tail_nan & (run > 0) & ~empty
        code = np.where(rotated, -2 - (d * (h + 1) + run), 0)
        code[rotated & (d == 0) & (run == h)] = FOLLOW
        self.own[off[rotated]] = code[rotated].astype(np.int32)
        self.irregular = int(np.count_nonzero(self.own[off] != FOLLOW))
        rest = ~rotated
        if rest.any():
            self._keep(off[rest], tring[:, off[rest]])
        return self
