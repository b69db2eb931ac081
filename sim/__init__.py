"""Vectorised accelerator-fleet simulator that emits contract window records."""
