"""Which stages of the execution flow a device's records let the monitor judge.

Contract §3 names the indicators of each stage. A device that sends only the
whole-device layer `all` (a dcgm-exporter sidecar) has no per-layer split: an
indicator that speaks for its stage only per layer type is, on `all`, evidence of
execution alone (`stage_of`).
"""

from __future__ import annotations

from monitor.wire import Stage

# Indicators that speak for their stage only per layer type. Arithmetic intensity on
# `all` mixes every layer's intensity, so it moves with the workload's mix as much as
# with tiling and placement (and dcgm-exporter's FLOPs are an estimate from tensor-pipe
# activity): a whole-device FLOPs-per-byte drop is what the devices executed, not
# scheduling evidence.
_PER_LAYER_ONLY = frozenset({"arith_intensity"})
COARSE_LAYER = "all"


def stage_of(metric: str, layer: str | None, stage: Stage) -> Stage:
    """The stage a change of `metric` on `layer` is evidence of: its own (`STAGE_OF`),
    except a per-layer-only indicator on the whole-device layer `all`, which is execution."""
    if layer == COARSE_LAYER and metric in _PER_LAYER_ONLY:
        return "execution"
    return stage
