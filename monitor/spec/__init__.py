"""Expectation files for replays: `flopwatch test`, its JUnit output and the pytest plugin."""
