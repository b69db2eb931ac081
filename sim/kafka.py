"""Kafka producer: records keyed by device, change events keyed by scope, paced by event time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from sim.run import Simulation


async def produce(
    sim: Simulation,
    producer: Any,
    samples_topic: str,
    changes_topic: str,
    speed: float | None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Send the run to Kafka; returns window records sent.

    `producer` is a started aiokafka AIOKafkaProducer. `speed` None sends as fast
    as possible; 1.0 paces by event time in real time; N runs N times faster.
    `progress` is called after each window with (windows sent, records sent).
    Sends are not awaited one by one: the client batches them, and each window
    ends with one flush so a window is delivered before the next one starts.
    """
    if speed is not None and speed <= 0:
        raise ValueError("speed must be > 0 or None")
    sent = 0
    t0 = time.monotonic()
    for k, win in enumerate(sim.windows(), start=1):
        if speed is not None:
            due = t0 + (win.ts - sim.start_ts) / speed
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        for key, value in win.changes:
            await producer.send(changes_topic, value=value, key=key)
        for key, value in win.records:
            await producer.send(samples_topic, value=value, key=key)
        sent += len(win.records)
        await producer.flush()
        if progress is not None:
            progress(k, sent)
    return sent
