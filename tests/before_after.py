"""A real before/after as one device's stream, from two real profiler traces (issue 22 item 6).

No GPU was at hand to record a small transformer before and after a deliberate regression,
so this stream is built from two real H100 traces already vendored in `tests/data/real/traces`
that differ in kernel selection for attention:

- before: `h100__Falconsai_nsfw_image_detection__1016002` (a ViT-B image classifier, bf16):
  attention on fused flash SDPA (`aten::_scaled_dot_product_flash_attention`,
  `pytorch_flash::flash_fwd_kernel`), fallback share 0;
- after: `h100__google_owlv2-large-patch14-ensemble__1016001` (OWLv2, a ViT-L/14 detector,
  bf16): eager attention, `bmm` + `softmax` kernels (`cunn_SoftMaxForward` dominant),
  fallback share 0.98.

They are different models, not one model before and after a change: same GPU (H100 SXM),
same precision, same software stack (HF transformers under torch.profiler), another
attention kernel, and also another size and sequence length. Both are ingested with
`flopwatch ingest torch-trace --host vit-bench --pool h100-vit --model vit-serving`, so they
are one device's windows under one workload name (the traces record
`Falconsai/nsfw_image_detection` and `google/owlv2-large-patch14-ensemble`).

Each trace holds one profiler step, so one window. The default detector learns a stream
from its first 32 windows (`burn_in`) and needs about ten more after a shift, so each
trace's one window is repeated, unchanged: `N_BEFORE` copies of the flash window, then
`N_AFTER` of the eager one, end to end (each window's `ts` is the previous one's plus its
own `window_s`, starting at the first trace's own `ts`). Nothing else is altered: every
value in the stream is one the adapter wrote for a real step. Repeated windows have no
noise, which is not what a live stream looks like (see docs/ingest.md).

    python -m tests.before_after          # check the fixture is what the traces give
    python -m tests.before_after --write  # regenerate it
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from monitor.cli import main as flopwatch
from monitor.ingest.output import encode

DATA = Path(__file__).parent / "data" / "real"
BEFORE = DATA / "traces" / "h100__Falconsai_nsfw_image_detection__1016002.json.gz"
AFTER = DATA / "traces" / "h100__google_owlv2-large-patch14-ensemble__1016001.json.gz"
FIXTURE = DATA / "before_after" / "vit_flash_to_eager.jsonl"
IDENTITY = ["--host", "vit-bench", "--pool", "h100-vit", "--model", "vit-serving"]
N_BEFORE, N_AFTER = 40, 20


def ingest(trace: Path) -> list[dict[str, Any]]:
    """`flopwatch ingest torch-trace TRACE` under the stream's identity: its records."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.jsonl"
        code = flopwatch(["ingest", "torch-trace", str(trace), *IDENTITY, "--out", str(out)])
        if code != 0:
            raise RuntimeError(f"flopwatch ingest torch-trace {trace} exited {code}")
        return [json.loads(line) for line in out.read_text().splitlines()]


def build(n_before: int = N_BEFORE, n_after: int = N_AFTER) -> bytes:
    """The stream as JSONL bytes: `n_before` flash windows, then `n_after` eager ones."""
    (before,), (after,) = ingest(BEFORE), ingest(AFTER)
    lines = []
    ts = before["ts"] - before["window_s"]
    for rec in [before] * n_before + [after] * n_after:
        ts += rec["window_s"]
        lines.append(encode({**rec, "ts": ts}))
    return b"\n".join(lines) + b"\n"


def main() -> int:
    """Compare the fixture with a fresh build (exit 1 when they differ), or --write it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    got = build()
    if args.write:
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_bytes(got)
        print(f"{FIXTURE}: {len(got)} bytes, {N_BEFORE} + {N_AFTER} windows")
        return 0
    same = FIXTURE.exists() and FIXTURE.read_bytes() == got
    print(f"{FIXTURE}: {'as built' if same else 'differs from a fresh build'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
