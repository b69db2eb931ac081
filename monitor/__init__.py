"""flopwatch: streaming MFU and memory-stall regression monitor for accelerator fleets."""

__version__ = "0.1.0"
