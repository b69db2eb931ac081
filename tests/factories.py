"""Small record factories for unit tests (the simulator covers realistic streams)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from monitor.core.layer_index import LayerIndex
from monitor.core.types import RawMessage

T0 = 1_764_432_000.0
PEAK = 989.4e12  # h100-sxm bf16 dense


def window(device: str, ts: float, *, pool: str = "train-a", mfu: float = 0.45,
           stall: float = 0.3, kernel: str = "fa3", fallback: float = 0.0,
           hw: str = "h100-sxm", model: str = "m@1", **extra: Any) -> dict[str, Any]:  # fmt: skip
    """One window record with an attention and an mlp layer."""
    host = device.split("/", maxsplit=1)[0]
    rec: dict[str, Any] = {
        "v": 1, "ts": ts, "window_s": 10.0, "device": device, "host": host, "pool": pool,
        "model": model, "hw": hw, "dtype": "bf16",
        "device_stats": {"clock_mhz": 1755.0, "temp_c": 70.0, "power_w": 650.0},
        "layers": [
            {"type": "attention", "flops": mfu * 6.0 * PEAK, "busy_s": 6.0, "cycles": 1e10,
             "stall_mem_cycles": stall * 1e10, "kernel": kernel, "fallback_frac": fallback},
            {"type": "mlp", "flops": 0.6 * 3.0 * PEAK, "busy_s": 3.0, "cycles": 1e10,
             "stall_mem_cycles": 1e9},
        ],
    }  # fmt: skip
    rec.update(extra)
    return rec


def msg(rec: dict[str, Any] | bytes, topic: str = "flopwatch.samples", partition: int = 0,
        offset: int = -1) -> RawMessage:  # fmt: skip
    """A raw message carrying a record."""
    value = rec if isinstance(rec, bytes) else json.dumps(rec).encode()
    key = None if isinstance(rec, bytes) else str(rec.get("device", "")).encode()
    return RawMessage(topic, partition, offset, key, value)


def fleet(windows: int, *, devices: int = 32, regress_at: int | None = None,
          regress_pool: str = "train-a", factor: float = 0.85, noise: float = 0.02,
          seed: int = 0, change_at: int | None = None, change_kind: str = "kernel_lib",
          change_scope: dict[str, str] | None = None,
          kernel_fallback: bool = True) -> list[list[RawMessage]]:  # fmt: skip
    """Batches (one per window) for two pools; optional regression on one pool ("*" = both).

    By default the regression is a kernel fallback after a kernel_lib change scoped to the
    regressed pool; `kernel_fallback=False` makes it a plain MFU drop (say, a driver).
    """
    rng = np.random.default_rng(seed)
    scope = change_scope if change_scope is not None else {"pool": regress_pool}
    batches: list[list[RawMessage]] = []
    for w in range(windows):
        ts = T0 + 10.0 * (w + 1)
        batch: list[RawMessage] = []
        if change_at is not None and w == change_at:
            batch.append(msg({"v": 1, "ts": ts - 5.0, "id": "chg-1", "kind": change_kind,
                              "scope": scope, "from": "2.3.0", "to": "2.4.0"},
                             topic="flopwatch.changes"))  # fmt: skip
        for d in range(devices):
            pool = "train-a" if d < devices // 2 else "train-b"
            bad = regress_at is not None and regress_pool in (pool, "*") and w >= regress_at
            noise_mfu = 1 + noise * rng.standard_normal()
            swapped = bad and kernel_fallback
            rec = window(
                f"node-{d // 8:03d}/gpu{d % 8}", ts, pool=pool,
                mfu=0.45 * noise_mfu * (factor if bad else 1.0),
                stall=0.3 * (1 + noise * rng.standard_normal()),
                kernel="fa3_fallback" if swapped else "fa3", fallback=0.4 if swapped else 0.0,
            )  # fmt: skip
            batch.append(msg(rec, partition=d % 4))
        batches.append(batch)
    return batches


def joining_fleet(
    windows: int = 140, join_at: int = 100, *, seed: int = 9
) -> list[list[RawMessage]]:
    """Batches: 8 train-a devices from the start, 4 more (`node-new/gpuN`) from `join_at`."""
    rng = np.random.default_rng(seed)
    batches = []
    for w in range(windows):
        ts = T0 + 10.0 * (w + 1)
        names = [f"node-000/gpu{d}" for d in range(8)]
        if w >= join_at:
            names += [f"node-new/gpu{d}" for d in range(4)]
        batches.append([
            msg(window(name, ts, mfu=0.45 * (1 + 0.02 * rng.standard_normal()),
                       stall=0.3 * (1 + 0.02 * rng.standard_normal())))
            for name in names
        ])  # fmt: skip
    return batches


class ListSource:
    """A source that yields fixed batches (the runner's seam, without Kafka)."""

    def __init__(self, batches: list[list[RawMessage]]) -> None:
        self._batches = batches

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        """Each batch once, in order."""
        for b in self._batches:
            yield b

    async def commit(self) -> None:
        """Nothing to acknowledge."""

    async def close(self) -> None:
        """Nothing to release."""


def keys_by_row(index: LayerIndex) -> list[tuple[int, str] | None]:
    """A layer index's (device row, layer type) per row up to its end (None: free)."""
    out: list[tuple[int, str] | None] = [None] * index.end
    for key, row in index.items():
        out[row] = key
    return out
