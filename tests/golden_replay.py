"""Replay the scenario pack and reduce what the monitor produced to comparable bytes.

The golden file `tests/data/golden/replay.json` holds, per scenario, every alert record
(JSON, as the sinks encode it) and a digest of every detector and load-model checkpoint
at the end of the run. A refactor that changes neither judgement nor state keeps both
byte-identical. When a change *means* to alter judgement, regenerate the file and say
why in the commit:

    python -m tests.golden_replay --write

Float results depend on the CPU's vector instructions: numpy and OpenBLAS pick kernels
at run time (AVX2 on one machine, AVX-512 on another), and a sum or a solve rounds its
last bit differently, which leaves alerts alike and checkpoint bytes not. The replay
therefore runs in a child process pinned to numpy's baseline kernels and one OpenBLAS
core type (`PINNED`), the same on every x86-64 machine.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.daemon.runner import Runner
from monitor.sinks.memory import ListSink
from monitor.sources.simulated import SimulatorSource
from sim.run import simulate
from sim.scenarios import SCENARIOS

GOLDEN = Path(__file__).parent / "data" / "golden" / "replay.json"
# Every classic scenario but the six-hour fleet_day, small enough for `make test`. The wide
# pack draws its physics per seed and is scored by bench.diagnose instead.
PACK = [n for n, sc in SCENARIOS.items() if n != "fleet_day" and sc.pack == "classic"]
DEVICES, SEED, PARTITIONS = 48, 11, 4
# numpy's run-time dispatch targets above its x86-64-v2 baseline, off; OpenBLAS's kernels
# for one core type every x86-64-v2 machine runs; one thread (no split-dependent sums).
PINNED = {
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Nehalem",
    "OPENBLAS_NUM_THREADS": "1",
}


def _digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:16]


async def replay(name: str) -> dict[str, Any]:
    """One scenario's alerts (JSON text per record) and checkpoint digests."""
    sc = SCENARIOS[name]
    sim = simulate(name, devices=DEVICES, duration_s=sc.default_duration_s, seed=SEED)
    settings = Settings()
    sink = ListSink()
    pipeline = Pipeline(settings)
    await Runner(SimulatorSource(sim, settings.kafka.topics, partitions=PARTITIONS),
                 pipeline, [sink]).run()  # fmt: skip
    state: dict[str, str] = {}
    for p, st in sorted(pipeline.partitions.items()):
        for kind, det in st.detectors.items():
            state[f"{p}/{kind}"] = _digest(det.snapshot())
        for kind, adj in st.adjusters.items():
            if adj is not None:
                snap = adj.snapshot()
                state[f"{p}/{kind}_load"] = _digest(b"".join(snap[c] for c in sorted(snap)))
    alerts = [msgspec.json.encode(a).decode() for a in sink.alerts]
    return {"alerts": alerts, "state": state}


def replay_all() -> dict[str, Any]:
    """Every scenario of the golden pack, in this process."""
    return {name: asyncio.run(replay(name)) for name in PACK}


def replay_pinned() -> dict[str, Any]:
    """Every scenario of the golden pack, in a child process on the `PINNED` kernels."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "replay.json"
        subprocess.run(
            [sys.executable, "-m", "tests.golden_replay", "--json", str(out)],
            cwd=root, env={**os.environ, **PINNED}, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        got: dict[str, Any] = json.loads(out.read_text())
    return got


def main() -> None:
    """Print a summary, or (--write) regenerate the golden file (on the pinned kernels)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--json", type=Path, help="write the replay here as JSON (pinned kernels)")
    args = ap.parse_args()
    if args.json:
        if any(os.environ.get(k) != v for k, v in PINNED.items()):
            sys.exit("--json runs on the pinned kernels only: use replay_pinned()")
        args.json.write_text(json.dumps(replay_all()))
        return
    got = replay_pinned()
    for name, r in got.items():
        print(f"{name}: {len(r['alerts'])} alert records, {len(r['state'])} state digests")
    if args.write:
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
