"""Benchmarks, each a module with a table and `--json`: `python -m bench.<name> --json PATH`."""
