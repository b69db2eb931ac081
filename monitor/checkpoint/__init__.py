"""Detector and incident state checkpointed to the Kafka state topic, per input partition."""

from monitor.checkpoint.checkpointer import Checkpointer, CheckpointStats, open_checkpointer
from monitor.checkpoint.format import Checkpoint
from monitor.checkpoint.store import CheckpointStore

__all__ = ["Checkpoint", "CheckpointStats", "CheckpointStore", "Checkpointer", "open_checkpointer"]
