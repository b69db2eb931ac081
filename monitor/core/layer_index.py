"""Which stream row holds each (device row, layer type): a grid of int32, not a dict.

A fleet has a handful of layer types and many devices, so a (device row x layer type)
grid of row numbers holds the index in 4 bytes per cell, and a batch's rows are found
with one numpy gather. A dict of (device row, type) tuples held about 200 bytes per
stream (the tuple, two ints, the dict entry, the reverse list), the largest share of
the stream table's memory at 100k devices. The first `GRID_TYPES` distinct type names
get a column each; any after them (a sender inventing type names) fall back to a dict,
so such a sender cannot widen every device's row of the grid.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping

import numpy as np

from monitor.arrays import I64, grown

# Columns of the grid: more distinct layer types than any model has; a name beyond
# them costs a dict entry instead of 4 bytes on every device.
GRID_TYPES = 32
_FREE, _SPILLED = -1, -2  # a row's type code: not in use; its type is in the fallback dict

Key = tuple[int, str]


class LayerIndex(Mapping[Key, int]):
    """(device row, layer type) -> layer stream row, and back."""

    def __init__(self) -> None:
        self.types: list[str] = []  # type name by grid column
        self._column: dict[str, int] = {}
        self._grid = np.full((0, 0), _FREE, dtype=np.int32)  # device row x column -> row
        self._spilled: dict[Key, int] = {}  # types beyond the grid's columns
        self._spilled_type: dict[int, str] = {}  # row -> its type, for those
        self.row_device = np.full(0, _FREE, dtype=np.int32)  # per layer row; -1 free
        self._row_column = np.full(0, _FREE, dtype=np.int16)
        self._count = 0
        self._end = 0

    # -- Mapping ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    def __getitem__(self, key: Key) -> int:
        row = self.get(key)
        if row is None:
            raise KeyError(key)
        return row

    def get(self, key: Key, default: int | None = None) -> int | None:  # type: ignore[override]
        """The row of (device row, layer type), `default` if it has none."""
        dev, layer = key
        col = self._column.get(layer)
        if col is None:
            return self._spilled.get(key, default)
        if dev >= self._grid.shape[0]:
            return default
        row = int(self._grid[dev, col])
        return default if row < 0 else row

    def __iter__(self) -> Iterator[Key]:
        return (key for key, _ in self.items())

    def items(self) -> Iterator[tuple[Key, int]]:  # type: ignore[override]
        """((device row, layer type), row) in row order."""
        rows = np.flatnonzero(self.row_device[: self._end] >= 0)
        keys = self._keys(rows)
        return zip(keys, rows.tolist(), strict=True)

    def _keys(self, rows: I64) -> list[Key]:
        """The keys of these rows in use, built a column at a time."""
        types, spilled = self.types, self._spilled_type
        cols = self._row_column[rows].tolist()
        layers = [
            types[c] if c >= 0 else spilled[r] for c, r in zip(cols, rows.tolist(), strict=True)
        ]
        return list(zip(self.row_device[rows].tolist(), layers, strict=True))

    def values(self) -> Iterator[int]:  # type: ignore[override]
        """Rows in use, in order."""
        return iter(np.flatnonzero(self.row_device[: self._end] >= 0).tolist())

    # -- rows ------------------------------------------------------------------------
    @property
    def end(self) -> int:
        """One past the highest row ever used (rows below it are in use or free)."""
        return self._end

    def reserve(self, end: int) -> None:
        """Count rows below `end` as used (free unless added): a restored table's."""
        if end > self._end:
            self._end = end
            self.row_device = grown(self.row_device, end, _FREE)
            self._row_column = grown(self._row_column, end, _FREE)

    def key(self, row: int) -> Key | None:
        """(device row, layer type) of a row; None if it is free."""
        if row >= self._end or self.row_device[row] < 0:
            return None
        col = int(self._row_column[row])
        layer = self._spilled_type[row] if col == _SPILLED else self.types[col]
        return int(self.row_device[row]), layer

    def lookup(self, dev_rows: I64, codes: I64, type_names: list[str]) -> I64:
        """Each entry's row (-1: none) from its device row and its type's code in
        `type_names` (one gather for the types with a column)."""
        cols = np.array([self._column.get(t, -1) for t in type_names], dtype=np.int64)
        ecol = cols[codes] if codes.size else np.empty(0, dtype=np.int64)
        rows = np.full(dev_rows.size, -1, dtype=np.int64)
        hit = (ecol >= 0) & (dev_rows < self._grid.shape[0])
        rows[hit] = self._grid[dev_rows[hit], ecol[hit]]
        if self._spilled:
            for i in np.flatnonzero(ecol < 0).tolist():
                rows[i] = self._spilled.get((int(dev_rows[i]), type_names[codes[i]]), -1)
        return rows

    def add(self, dev: int, layer: str, row: int) -> None:
        """Put (device row, layer type) at `row`, which must be free."""
        col = self._column.get(layer)
        if col is None and len(self.types) < GRID_TYPES:
            col = len(self.types)
            self.types.append(sys.intern(layer))
            self._column[self.types[col]] = col
            grid = np.full((self._grid.shape[0], col + 1), _FREE, dtype=np.int32)
            grid[:, :col] = self._grid
            self._grid = grid
        self.reserve(row + 1)
        if col is None:
            layer = sys.intern(layer)
            self._spilled[(dev, layer)] = row
            self._spilled_type[row] = layer
            self._row_column[row] = _SPILLED
        else:
            self._grid = grown(self._grid, dev + 1, _FREE)
            self._grid[dev, col] = row
            self._row_column[row] = col
        self.row_device[row] = dev
        self._count += 1

    def remove(self, rows: list[int]) -> None:
        """Free these rows (each in use)."""
        if not rows:
            return
        idx = np.asarray(rows, dtype=np.int64)
        cols = self._row_column[idx].astype(np.int64)
        devs = self.row_device[idx].astype(np.int64)
        if (devs < 0).any():
            raise KeyError(int(idx[np.argmax(devs < 0)]))
        gridded = cols >= 0
        self._grid[devs[gridded], cols[gridded]] = _FREE
        for i in np.flatnonzero(~gridded).tolist():
            row = int(idx[i])
            del self._spilled[(int(devs[i]), self._spilled_type.pop(row))]
        self.row_device[idx] = _FREE
        self._row_column[idx] = _FREE
        self._count -= idx.size

    def rows_of_devices(self, devs: list[int]) -> list[int]:
        """The rows in use of these device rows, in row order."""
        return np.flatnonzero(np.isin(self.row_device[: self._end], devs)).tolist()

    # -- checkpoint ------------------------------------------------------------------
    def columns(self) -> tuple[bytes, bytes, list[str], list[tuple[int, str]]]:
        """Per row its device (int32, -1 free) and grid column (int16, -2: spilled), the
        column's type names, and (row, type) of the spilled rows: `from_columns` input."""
        end = self._end
        spilled = sorted(self._spilled_type.items())
        return (self.row_device[:end].tobytes(), self._row_column[:end].tobytes(),
                list(self.types), spilled)  # fmt: skip

    @classmethod
    def from_columns(
        cls, devices: bytes, columns: bytes, types: list[str], spilled: list[tuple[int, str]]
    ) -> LayerIndex:
        """The index `columns` wrote."""
        dev = np.frombuffer(devices, dtype=np.int32)
        col = np.frombuffer(columns, dtype=np.int16)
        if dev.size != col.size or (col >= len(types)).any():
            raise ValueError("layer index columns disagree")
        index = cls()
        index.reserve(dev.size)
        index.row_device[: dev.size] = dev
        index._row_column[: col.size] = col
        index.types = [sys.intern(t) for t in types]
        index._column = {t: c for c, t in enumerate(index.types)}
        used = np.flatnonzero(dev >= 0)
        gridded = used[col[used] >= 0]
        rows_needed = int(dev[used].max()) + 1 if used.size else 0
        index._grid = np.full((max(rows_needed, 64), len(types)), _FREE, dtype=np.int32)
        index._grid[dev[gridded], col[gridded]] = gridded
        for row, name in spilled:
            layer = sys.intern(name)
            index._spilled[(int(dev[row]), layer)] = row
            index._spilled_type[row] = layer
        if len(index._spilled) + gridded.size != used.size:
            raise ValueError("layer index columns disagree")
        index._count = int(used.size)
        return index
