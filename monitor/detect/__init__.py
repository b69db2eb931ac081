"""Change-point detectors behind one interface (`base.Detector`), and the factory by kind."""

from monitor.detect.base import Detections, Detector, StateShapeError
from monitor.detect.factory import (
    DEFAULT_KIND,
    KINDS,
    REGISTRY,
    detector_params,
    make_detector,
    restore_configured,
    restore_detector,
)

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "REGISTRY",
    "Detections",
    "Detector",
    "StateShapeError",
    "detector_params",
    "make_detector",
    "restore_configured",
    "restore_detector",
]
