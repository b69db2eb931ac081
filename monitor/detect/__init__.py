"""Change-point detectors behind one interface (`base.Detector`), and the factory by kind."""

from monitor.detect.base import Detections, Detector
from monitor.detect.factory import (
    DEFAULT_KIND,
    KINDS,
    detector_params,
    make_detector,
    restore_configured,
    restore_detector,
)

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "Detections",
    "Detector",
    "detector_params",
    "make_detector",
    "restore_configured",
    "restore_detector",
]
