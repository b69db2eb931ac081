"""A small, deterministic binary envelope for detector checkpoints.

Layout: magic ``FWD1``, a 4-byte little-endian header length, a JSON header
(kind tag, scalar parameters, array names/dtypes/shapes), then the raw array
bytes in header order. No pickle, no zip timestamps: the same state always
gives the same bytes, and a blob carries its own kind so `restore_detector`
can dispatch on it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

MAGIC = b"FWD1"
_LEN = struct.Struct("<I")


def pack(kind: str, params: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialise a kind tag, JSON-able parameters and named arrays into one blob."""
    specs = []
    chunks: list[memoryview] = []
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        specs.append([name, a.dtype.str, list(a.shape)])
        # The array's own buffer: `join` copies it once (a `tobytes` first would copy
        # a partition's whole detector state twice).
        chunks.append(a.data)
    header = json.dumps(
        {"kind": kind, "params": dict(params), "arrays": specs}, sort_keys=True
    ).encode()
    return b"".join([MAGIC, _LEN.pack(len(header)), header, *chunks])


def kind_of(blob: bytes) -> str | None:
    """The kind tag of an enveloped blob, or None when the blob has no envelope."""
    if not blob.startswith(MAGIC) or len(blob) < 8:
        return None
    (n,) = _LEN.unpack_from(blob, 4)
    try:
        kind = json.loads(blob[8 : 8 + n])["kind"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(kind)


def unpack(blob: bytes, kind: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Parameters and (writable) arrays of a blob written by `pack` with this kind."""
    found = kind_of(blob)
    if found != kind:
        raise ValueError(f"not a {kind!r} detector checkpoint (found {found!r})")
    (n,) = _LEN.unpack_from(blob, 4)
    header = json.loads(blob[8 : 8 + n])
    off = 8 + n
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape in header["arrays"]:
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        arr = np.frombuffer(blob, dtype=dt, count=count, offset=off).reshape(shape)
        arrays[name] = arr.copy()
        off += count * dt.itemsize
    if off != len(blob):
        raise ValueError("detector checkpoint has trailing or missing bytes")
    params: dict[str, Any] = header["params"]
    return params, arrays
