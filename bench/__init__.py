"""Benchmarks: `python bench/<name>.py --json PATH` (a package so `bench/sim.py` is `bench.sim`)."""
