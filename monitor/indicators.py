"""Derived metrics and their place in the execution flow (contract §1 and §3).

All functions take numpy columns and return numpy columns: one call per batch,
never one per sample. A missing input (NaN) gives a missing output.
"""

from __future__ import annotations

import numpy as np

from monitor.arrays import F64
from monitor.wire import Stage

# Columns of the per (device, layer type) stream matrix.
LAYER_METRICS: tuple[str, ...] = (
    "mfu", "stall_frac", "arith_intensity", "sync_frac",
    "occupancy", "sram_hit", "spill_frac", "fallback_frac",
)  # fmt: skip
# Columns of the per-device stream matrix.
DEVICE_METRICS: tuple[str, ...] = (
    "device_mfu", "clock_mhz", "temp_c", "power_w",
    "req_rate", "queue_depth", "queue_wait_ms", "batch",
    "lat_p50_ms", "lat_p95_ms", "lat_p99_ms", "quality", "error_rate",
)  # fmt: skip
# `error_rate` is derived: `slo.errors` per request of the window (`error_rate`).

STAGE_OF: dict[str, Stage] = {
    "req_rate": "ingress", "queue_depth": "ingress", "queue_wait_ms": "ingress", "batch": "ingress",
    "kernel": "lowering", "fallback_frac": "lowering",
    "sram_hit": "scheduling", "spill_frac": "scheduling", "arith_intensity": "scheduling",
    "mfu": "execution", "stall_frac": "execution", "occupancy": "execution",
    "sync_frac": "execution", "device_mfu": "execution", "clock_mhz": "execution",
    "temp_c": "execution", "power_w": "execution",
    "lat_p50_ms": "validation", "lat_p95_ms": "validation", "lat_p99_ms": "validation",
    "quality": "validation", "error_rate": "validation",
}  # fmt: skip

# The metrics an alert can be about, most telling first; the others are evidence only.
# Ingress and validation incidents have MFU flat, so latency and quality must open them.
# A communication layer (a collective) does no model FLOPs: its MFU (~1e-5) means nothing,
# its efficiency is the share of its time spent waiting (sync fraction), which is primary
# there and only there (`is_primary`).
# A device's temperature heads an incident only when nothing that heats it explains its
# rise (`correlator.Correlator.add`): the cooling failed, before anything throttles.
PRIMARY_ORDER: tuple[str, ...] = (
    "mfu", "stall_frac", "sync_frac", "device_mfu", "quality", "lat_p99_ms", "queue_wait_ms",
    "error_rate", "temp_c",
)  # fmt: skip
PRIMARY_METRICS = frozenset(PRIMARY_ORDER)
COMM_LAYERS = frozenset({"allreduce"})


def is_primary(metric: str, layer: str | None) -> bool:
    """Whether a change of this metric on this layer opens an incident as soon as it is
    found (heat waits to be judged against what heats the device, `HEAT`)."""
    if metric == "sync_frac":
        return layer in COMM_LAYERS
    return metric in PRIMARY_METRICS and metric not in HEAT


# Evidence that independently corroborates a change on the same device: a second
# mechanism, not a second view of the same noisy timing (mfu and stall move together),
# and not load itself (temperature and power rise with every burst; a throttle shows
# as the clock stepping down).
CORROBORATING = frozenset({
    "clock_mhz", "sync_frac", "fallback_frac", "kernel",
    "sram_hit", "spill_frac", "queue_wait_ms", "queue_depth", "quality",
})  # fmt: skip
# Offered load: a shift of it is context for an incident (the pool is busier), never a
# regression and never evidence of a failing stage.
LOAD_METRICS = frozenset({"req_rate"})
# What a backlog in front of the devices moves: queue and the latency it adds. An incident
# that moved only these, while offered load rose, is overload, not a regression.
QUEUEING = frozenset({"queue_wait_ms", "queue_depth", "lat_p50_ms", "lat_p95_ms", "lat_p99_ms"})
# What only a queue moves: its length and the time a request waits in it. Latency is that
# wait plus the time in service; where the devices report their queue and it held, a
# latency rise is service time (the devices got slower), not a backlog.
WAITING = frozenset({"queue_wait_ms", "queue_depth"})
# What a full queue adds: requests turned away at the admission limit fail. Failures
# follow a backlog only with it (a queue moved too); failures alone are a regression.
SHEDDING = frozenset({"error_rate"})
BACKLOG = QUEUEING | SHEDDING
# Execution indicators that follow offered load rather than a mechanism: heat (temperature,
# power) and utilisation (device MFU is served work: a saturated pool serves less than its
# offered load predicts). A throttle shows as the clock, a slower kernel as layer MFU.
LOAD_FOLLOWING = frozenset({"temp_c", "power_w", "device_mfu"})
# What a thermal throttle follows: the die's temperature, which climbs over the cooling's
# time constant (tens of seconds to minutes) before the clock steps down.
HEAT = frozenset({"temp_c"})
# What heats a die: the power it draws, and the offered load that makes it draw more.
# At steady state a die sits at inlet + R * power (R: the cooling's thermal resistance),
# so with the cooling unchanged its temperature rises only when power does (or, later,
# by its time constant, after power did). A rise that none of these explains is the
# cooling's: a failing fan or blocked airflow, found before anything throttles.
HEAT_SOURCES = frozenset({"power_w", "req_rate"})
# What a device's clock moves: its own efficiency (a faster core spends a larger share of its
# time waiting on memory), not its answers or a collective's waits.
CLOCK_BOUND = frozenset({"mfu", "stall_frac", "device_mfu"})
# Direction that counts as a regression (+1 up is bad, -1 down is bad).
BAD_DIRECTION: dict[str, int] = {
    "mfu": -1, "device_mfu": -1, "stall_frac": +1, "occupancy": -1, "sram_hit": -1,
    "spill_frac": +1, "fallback_frac": +1, "sync_frac": +1, "arith_intensity": -1,
    "clock_mhz": -1, "temp_c": +1, "power_w": +1, "queue_wait_ms": +1, "queue_depth": +1,
    "lat_p50_ms": +1, "lat_p95_ms": +1, "lat_p99_ms": +1, "quality": -1, "error_rate": +1,
    "req_rate": 0, "batch": 0, "kernel": +1,
}  # fmt: skip

# Proportions near 1 are judged on their complement, the error rate: quality 0.999 -> 0.990
# is a 0.9 % move of quality and a tenfold error rate. Materiality floors, severity and
# recovery compare error rates (up is bad) for these metrics.
COMPLEMENT = frozenset({"quality"})


# Shares of a unit's time spent not working: waiting at a collective (`sync_frac`), stalled
# on memory (`stall_frac`). The time a unit of that work takes is 1 / (1 - share), so a
# rise costs 1 - (1 - after) / (1 - before) of its rate, not 1 - before / after: a wait
# share 0.14 -> 0.21 slows the collective by 8 %, not 32 %.
TIME_SHARES = frozenset({"sync_frac", "stall_frac"})


def judged(metric: str, value: float) -> float:
    """A level on the scale its metric is judged on (the error rate 1 - q for quality)."""
    return 1.0 - value if metric in COMPLEMENT else value


def judged_sign(metric: str) -> int:
    """The bad direction on that scale (+1: up is bad)."""
    sign = BAD_DIRECTION.get(metric, -1)
    return -sign if metric in COMPLEMENT else sign


# Smallest absolute shift worth reporting, per metric: a 20% change of an all-reduce's
# 0.0001 MFU is statistically real and operationally meaningless.
MIN_ABS_CHANGE: dict[str, float] = {
    "mfu": 0.01, "device_mfu": 0.01, "stall_frac": 0.01, "sync_frac": 0.01,
    "occupancy": 0.01, "sram_hit": 0.01, "spill_frac": 0.005, "fallback_frac": 0.01,
    "quality": 0.001, "error_rate": 0.001,
}  # fmt: skip

# Smallest relative shift worth reporting (vs the level before), per metric; 5% otherwise.
# Quality's is relative to its error rate: a quarter more failed answers is a bad model
# (and a quarter more failed requests a bad service); a 10% p99 wobble is a normal afternoon.
MIN_REL_CHANGE: dict[str, float] = {
    "quality": 0.25, "error_rate": 0.25, "clock_mhz": 0.03, "lat_p50_ms": 0.10, "lat_p95_ms": 0.10,
    "lat_p99_ms": 0.10, "queue_wait_ms": 0.25, "queue_depth": 0.25,
}  # fmt: skip
DEFAULT_MIN_REL_CHANGE = 0.05


def material_floors(
    metrics: tuple[str, ...],
    rel: dict[str, float] | None = None,
    abs_: dict[str, float] | None = None,
) -> tuple[F64, F64]:
    """(absolute, relative) reporting floors per metric column, `rel` / `abs_` overriding."""
    rel, abs_ = rel or {}, abs_ or {}
    floor_abs = np.array([abs_.get(m, MIN_ABS_CHANGE.get(m, 0.0)) for m in metrics])
    floor_rel = np.array(
        [rel.get(m, MIN_REL_CHANGE.get(m, DEFAULT_MIN_REL_CHANGE)) for m in metrics]
    )
    return floor_abs, floor_rel


# Layer columns fed in, in this order, by the stream table.
LAYER_INPUTS: tuple[str, ...] = (
    "flops", "busy_s", "cycles", "stall_mem_cycles", "occupancy", "bytes_hbm",
    "sram_hit", "spill_bytes", "sync_wait_s", "fallback_frac",
)  # fmt: skip


def _ratio(num: F64, den: F64) -> F64:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / den
    out[~np.isfinite(out)] = np.nan
    return out


def layer_metrics(raw: F64, peak: F64) -> F64:
    """(n, len(LAYER_INPUTS)) raw counters + per-row peak FLOP/s -> (n, len(LAYER_METRICS))."""
    col = {name: raw[:, i] for i, name in enumerate(LAYER_INPUTS)}
    out = np.empty((raw.shape[0], len(LAYER_METRICS)))
    out[:, 0] = _ratio(col["flops"], col["busy_s"] * peak)
    out[:, 1] = _ratio(col["stall_mem_cycles"], col["cycles"])
    out[:, 2] = _ratio(col["flops"], col["bytes_hbm"])
    out[:, 3] = _ratio(col["sync_wait_s"], col["busy_s"])
    out[:, 4] = col["occupancy"]
    out[:, 5] = col["sram_hit"]
    out[:, 6] = _ratio(col["spill_bytes"], col["bytes_hbm"] + col["spill_bytes"])
    out[:, 7] = col["fallback_frac"]
    return out


def device_mfu(flops_sum: F64, window_s: F64, peak: F64) -> F64:
    """Device MFU = sum(flops) / (window_s * peak); NaN where peak is unknown."""
    return _ratio(flops_sum, window_s * peak)


def error_rate(errors: F64, req_rate: F64, window_s: F64) -> F64:
    """Failed requests per request of the window: `slo.errors / (req_rate * window_s)`.

    Bounded by 1 whether the exporter's rate counts the failed requests or only the
    served ones; NaN where either field is missing or the window saw no request.
    """
    return _ratio(errors, np.maximum(req_rate * window_s, errors))


def per_peak(raw: F64, peak: F64) -> F64:
    """Raw layer counters with flops in units of each row's peak, to be summed per group:
    pool MFU = sum(flops/peak) / sum(busy_s) lets one pool mix chips (`summed_layers`)."""
    scaled = raw.copy()
    fl = LAYER_INPUTS.index("flops")
    scaled[:, fl] = raw[:, fl] / peak
    return scaled


_MEANS = [LAYER_INPUTS.index(k) for k in ("occupancy", "sram_hit", "fallback_frac")]


def summed_layers(sums: F64, counts: F64) -> F64:
    """A group's raw-like layer counters from per-column sums and finite counts of
    `per_peak` rows: counters summed, ratio counters averaged (NaN: none measured)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(counts > 0, sums, np.nan)
        for c in _MEANS:
            out[:, c] = sums[:, c] / counts[:, c]
    return out
