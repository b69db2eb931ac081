"""`python -m sim`: the simulator CLI on its own (the same options as `flopwatch sim`)."""

from __future__ import annotations

import argparse
import asyncio

from sim.cli import add_arguments, main


def run() -> int:
    """Parse arguments and run the simulator CLI."""
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__)
    add_arguments(parser)
    return asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(run())
