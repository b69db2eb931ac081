"""`flopwatch ingest torch-trace` on real profiler traces (tests/data/real, see PROVENANCE.md)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.cli import main
from monitor.config import LayerRule
from monitor.hardware import Catalog
from monitor.ingest.flops import op_flops
from monitor.ingest.rules import HwAliases, LayerRules, short_kernel_name
from monitor.ingest.torch_trace import Identity, _union_s, ingest_trace
from monitor.wire import Codec

TRACES = Path(__file__).resolve().parents[2] / "data" / "real" / "traces"
FIXTURES = sorted(TRACES.glob("*.json.gz"))
H100_QWEN = TRACES / "h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
MI300_QWEN = TRACES / "mi300__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
OWLV2 = TRACES / "h100__google_owlv2-large-patch14-ensemble__1016001.json.gz"
TF32 = TRACES / "trace_diff__control__control.json.gz"
OLD_SCHEMA = (
    TRACES / "tb_plugin__samples__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
)
CUDA_GRAPH = TRACES / "inference__sglang_decode__sglang_Qwen3-8B_decode.json.gz"


def _ingest(path: Path, rules: LayerRules | None = None) -> list[dict[str, Any]]:
    records, _ = ingest_trace(path, rules or LayerRules.build(), HwAliases(), Catalog(), Identity())
    return records


def _mfu(rec: dict[str, Any], layer: dict[str, Any], dtype: str | None = None) -> float | None:
    peak = Catalog().peak_flops(rec.get("hw"), dtype or rec.get("dtype"))
    if peak is None or "flops" not in layer or not layer["busy_s"]:
        return None
    return float(layer["flops"] / (layer["busy_s"] * peak))


def _layers(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {la["type"]: la for rec in records for la in rec["layers"]}


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture ingested once through the CLI, each to its own recording."""
    out = tmp_path_factory.mktemp("ingest")
    files = {}
    for trace in FIXTURES:
        files[trace.name] = out / f"{trace.name}.jsonl"
        assert main(["ingest", "torch-trace", str(trace), "--out", str(files[trace.name])]) == 0
    return files


def test_fixtures_are_small() -> None:
    """Each vendored trace stays under 5 MB."""
    assert len(FIXTURES) >= 10
    assert all(p.stat().st_size < 5 * 2**20 for p in FIXTURES)


@pytest.mark.parametrize("name", [p.name for p in FIXTURES])
def test_every_record_decodes_and_mfu_lies_in_0_1(ingested: dict[str, Path], name: str) -> None:
    """Each fixture yields records that decode under the contract; MFU in (0, 1]."""
    codec = Codec()
    lines = ingested[name].read_bytes().splitlines()
    assert lines
    for line in lines:
        rec = codec.decode_window(line)
        assert rec.source == "torch-profiler"
        assert rec.layers
        data = json.loads(line)
        for layer in data["layers"]:
            mfu = _mfu(data, layer)
            if mfu is not None:
                assert 0 < mfu <= 1, (name, layer["type"], mfu)


def test_replay_rejects_none(ingested: dict[str, Path], tmp_path: Path) -> None:
    """All fixtures' records replayed as one stream: not one dead letter."""
    merged = tmp_path / "all.jsonl"
    merged.write_bytes(b"".join(p.read_bytes() for p in ingested.values()))
    dead = tmp_path / "dead.jsonl"
    alerts = tmp_path / "alerts.jsonl"
    assert main(["replay", str(merged), "--dead-letters", str(dead),
                 "--alerts-out", str(alerts)]) == 0  # fmt: skip
    assert dead.read_text() == ""


def test_same_model_on_h100_and_mi300x_yields_the_same_layer_types() -> None:
    """Qwen1.5-0.5B on H100 (flash + sm90 xmma) and MI300X (attn_fwd + Cijk): same types,
    both with attention and MLP MFU, on their own catalog entries."""
    h100, mi300 = _ingest(H100_QWEN), _ingest(MI300_QWEN)
    assert {r["hw"] for r in h100} == {"h100-sxm"}
    assert {r["hw"] for r in mi300} == {"mi300x"}
    assert set(_layers(h100)) == set(_layers(mi300))
    assert {"attention", "mlp", "norm", "embedding"} <= set(_layers(h100))
    for recs in (h100, mi300):
        for layer in ("attention", "mlp"):
            mfu = _mfu(recs[0], _layers(recs)[layer])
            assert mfu is not None
            assert 0.05 < mfu <= 1


def test_unfused_attention_shows_its_fallback_share() -> None:
    """owlv2 runs eager attention (softmax + bmm): most of its attention compute is on
    fallback kernels; Qwen on flash attention has none."""
    owl = _layers(_ingest(OWLV2))["attention"]
    assert owl["fallback_frac"] > 0.5
    assert "softmax" in owl["kernel"].lower()
    assert _layers(_ingest(H100_QWEN))["attention"]["fallback_frac"] == 0.0


def test_tf32_trace_stays_at_or_below_one() -> None:
    """An fp32 model on TF32 cutlass GEMMs: judged at the fp32 peak its MLP MFU would
    exceed 1; the record says tf32, and MFU stays in (0, 1]."""
    records = _ingest(TF32)
    assert {r["dtype"] for r in records} == {"tf32"}
    for rec in records:
        mlp = next(la for la in rec["layers"] if la["type"] == "mlp")
        fp32 = _mfu(rec, mlp, "fp32")
        tf32 = _mfu(rec, mlp)
        assert fp32 is not None
        assert tf32 is not None
        assert fp32 > 1
        assert 0 < tf32 <= 1


def test_windows_follow_profiler_steps() -> None:
    """One record per ProfilerStep: windows tile the steps, in order, never cutting one."""
    records = _ingest(TF32)
    assert len(records) == 6  # ProfilerStep#1009..#1014
    ts = [r["ts"] for r in records]
    assert ts == sorted(ts)
    for prev, rec in itertools.pairwise(records):
        assert rec["ts"] - prev["ts"] == pytest.approx(rec["window_s"], abs=1e-5)
    grouped, _ = ingest_trace(
        TF32, LayerRules.build(), HwAliases(), Catalog(), Identity(steps_per_window=4)
    )
    assert len(grouped) == 2  # 4 steps, then the 2 left: a step is never split
    assert grouped[-1]["ts"] == pytest.approx(records[-1]["ts"])


def test_old_schema_links_by_lowercase_external_id() -> None:
    """The 2021 schema (`Kernel`, `Runtime`, `external id`) links every kernel."""
    _, stats = ingest_trace(OLD_SCHEMA, LayerRules.build(), HwAliases(), Catalog(), Identity())
    assert stats.linked_share > 0.99
    assert stats.windows == 6
    assert {"conv", "norm", "mlp"} <= set(_layers(_ingest(OLD_SCHEMA)))


def test_cuda_graph_replay_is_typed_by_kernel_name() -> None:
    """Under CUDA-graph replay the launching op says nothing; kernel names still type the
    paged attention, the rmsnorm and the GEMMs."""
    layers = _layers(_ingest(CUDA_GRAPH))
    assert layers["attention"]["kernel"].startswith("paged_attention")
    assert {"attention", "norm", "mlp"} <= set(layers)


def test_collectives_report_exposed_wait() -> None:
    """NCCL time not hidden behind compute becomes the all-reduce layer's sync wait."""
    for rec in _ingest(TF32):
        ar = next(la for la in rec["layers"] if la["type"] == "allreduce")
        assert 0 < ar["sync_wait_s"] <= ar["busy_s"]


def test_config_rules_come_first() -> None:
    """A user rule for a module name wins over the built-in table."""
    rules = LayerRules.build([LayerRule(field="module", pattern="Qwen2MLP", type="moe_router")])
    layers = _layers(_ingest(H100_QWEN, rules))
    assert "moe_router" in layers
    assert "mlp" not in layers


def test_not_a_trace_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that is not a trace: exit 2 and one line on stderr, nothing on stdout."""
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": "world"}')
    assert main(["ingest", "torch-trace", str(bad)]) == 2
    err = capsys.readouterr()
    assert err.out == ""
    assert err.err.count("\n") == 1
    assert "not a PyTorch profiler trace" in err.err
    (tmp_path / "bin.gz").write_bytes(b"\x1f\x8b garbage")
    assert main(["ingest", "torch-trace", str(tmp_path / "bin.gz")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_union_counts_overlapping_streams_once() -> None:
    """Busy time is the union: two streams overlapping for 1 s give 3 s, not 4."""
    assert _union_s(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0])) == 4.0
    assert _union_s(np.array([0.0, 0.5]), np.array([2.0, 1.0])) == 2.0


def test_flops_formulas_and_kernel_names() -> None:
    """FLOPs from recorded shapes; stride known from Concrete Inputs; short kernel names."""
    assert op_flops("aten::mm", {"Input Dims": [[8, 16], [16, 4]]}) == (2 * 8 * 16 * 4, True)
    assert op_flops("aten::linear", {"Input Dims": [[2, 3, 16], [4, 16], [4]]})[0] == 2 * 6 * 16 * 4
    conv = {"Input Dims": [[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], []],
            "Concrete Inputs": ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"]}  # fmt: skip
    assert op_flops("aten::conv2d", conv)[0] == 2 * 4 * 4 * 4 * 3 * 9
    assert op_flops("aten::conv2d", {"Input Dims": conv["Input Dims"]})[0] is None
    assert op_flops("aten::mm", {"flops": 10.0}) == (10.0, False)
    assert (
        short_kernel_name(
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1>(P::Params)"
        )
        == "cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1"
    )
    assert (
        short_kernel_name(
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>(float*)"
        )
        == "at::native::cunn_SoftMaxForward"
    )
