"""Array type aliases shared by every layer (and by the simulator), and array growth."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Bools = npt.NDArray[np.bool_]


def grown(arr: np.ndarray, n: int, fill: float) -> np.ndarray:
    """`arr` with room for `n` leading entries (capacity doubles, at least 64), new
    entries `fill`; `arr` itself when it has room."""
    if n <= arr.shape[0]:
        return arr
    out = np.full((max(n, 2 * arr.shape[0], 64), *arr.shape[1:]), fill, dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out
