"""Decoder: every rejection names the field; no input crashes it; good records round-trip."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.errors import DecodeError
from monitor.wire import Alert, Codec, WindowRecord, json_schemas

GOOD = {
    "v": 1, "ts": 1764432010.0, "window_s": 10.0, "device": "node-017/gpu3",
    "host": "node-017", "pool": "train-a", "model": "llama-70b@v12", "hw": "h100-sxm",
    "dtype": "bf16",
    "ingress": {"req_rate": 220.0, "queue_depth": 12, "queue_wait_ms": 3.1, "batch": 32},
    "device_stats": {"power_w": 650.0, "temp_c": 71.0, "clock_mhz": 1755.0},
    "slo": {"lat_p50_ms": 41.0, "lat_p95_ms": 77.0, "lat_p99_ms": 120.0, "quality": 0.999,
            "errors": 0},
    "layers": [
        {"type": "attention", "flops": 3.1e15, "busy_s": 6.2, "cycles": 1.2e10,
         "stall_mem_cycles": 4.1e9, "occupancy": 0.62, "bytes_hbm": 1.1e13, "sram_hit": 0.81,
         "spill_bytes": 0.0, "sync_wait_s": 0.3, "kernel": "flash_attn_v3", "fallback_frac": 0.0},
        {"type": "mlp", "flops": 1e15, "busy_s": 2.0},
        {"type": "norm", "busy_s": 0.5},
    ],
}  # fmt: skip


def _with(path: str, value: object) -> bytes:
    rec = json.loads(json.dumps(GOOD))
    node = rec
    parts = path.split(".")
    for p in parts[:-1]:
        node = node[int(p)] if p.isdigit() else node[p]
    last = parts[-1]
    if value is _DELETE:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return json.dumps(rec).encode()


_DELETE = object()

BAD = [
    (_with("layers.2.busy_s", -1), "layers[2].busy_s: expected >= 0, got -1"),
    (_with("window_s", 0), "window_s: expected > 0, got 0"),
    (_with("window_s", -5.5), "window_s: expected > 0, got -5.5"),
    (_with("ts", _DELETE), "ts: missing required field"),
    (_with("layers", _DELETE), "layers: missing required field"),
    (_with("device", _DELETE), "device: missing required field"),
    (_with("device", ""), "device: expected a string of length >= 1, got ''"),
    (_with("v", 2), "v: unsupported value 2"),
    (_with("layers.0.flops", "lots"), "layers[0].flops: expected a number, got 'lots'"),
    (_with("layers.0.occupancy", 1.5), "layers[0].occupancy: expected <= 1, got 1.5"),
    (_with("layers.0.fallback_frac", -0.1), "layers[0].fallback_frac: expected >= 0, got -0.1"),
    (_with("layers.1.type", _DELETE), "layers[1].type: missing required field"),
    (_with("layers", {}), "layers: expected an array, got an object"),
    (_with("ingress", 3), "ingress: expected an object, got 3"),
    (_with("slo.lat_p99_ms", -3), "slo.lat_p99_ms: expected >= 0, got -3"),
    (_with("device_stats.power_w", -1), "device_stats.power_w: expected >= 0, got -1"),
    (
        _with("layers.0.stall_mem_cycles", 2e10),
        "layers[0].stall_mem_cycles: expected <= cycles (12000000000), got 20000000000",
    ),
    (b'{"v":1,"ts":1e999,"window_s":10,"device":"d","layers":[]}',
     "ts: expected a finite number, got a value out of range"),
    (b'{"v":1,"ts":NaN,"window_s":10,"device":"d","layers":[]}', "malformed JSON"),
    (b'{"v":1,"ts":Infinity,"window_s":10,"device":"d","layers":[]}', "malformed JSON"),
    (b'{"v":1,"ts":1,"window_s":10,"device":"d","layers":[', "malformed JSON"),
    (b"", "malformed JSON"),
    (b"\xff\xfe", "malformed JSON"),
    (b"[1, 2]", "record: expected an object, got an array"),
    (b"null", "record: expected an object, got null"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "reason"), BAD, ids=[r for _, r in BAD])
def test_bad_record_rejected_with_field_named_reason(data: bytes, reason: str) -> None:
    """Each bad record raises DecodeError whose reason starts with the expected text."""
    with pytest.raises(DecodeError) as exc:
        Codec().decode_window(data)
    assert exc.value.reason.startswith(reason), exc.value.reason


def test_good_record_decodes_and_round_trips() -> None:
    """The contract's example decodes; unknown fields are ignored; encode/decode is stable."""
    data = dict(GOOD, future_field={"x": 1})
    rec = Codec().decode_window(json.dumps(data).encode())
    assert rec.device == "node-017/gpu3"
    assert rec.layers[0].kernel == "flash_attn_v3"
    assert rec.layers[2].flops is None  # missing = not measured, never zero
    again = Codec().decode_window(Codec().encode(rec))
    assert again == rec


def test_minimal_record_only_required_fields() -> None:
    """v, ts, window_s, device and an empty layers list are enough."""
    rec = Codec().decode_window(b'{"v":1,"ts":5,"window_s":1,"device":"d","layers":[]}')
    assert rec.layers == []
    assert rec.pool is None


def test_change_event_and_alert_from_contract_decode() -> None:
    """The contract's change-event and alert examples are valid records."""
    codec = Codec()
    ev = codec.decode_change(
        b'{"v": 1, "ts": 1764431900.0, "id": "chg-4821", "kind": "kernel_lib",'
        b' "scope": {"pool": "train-a"}, "from": "2.3.0", "to": "2.4.0",'
        b' "author": "ci-bot", "url": "https://ci.example/run/4821"}'
    )
    assert (ev.from_, ev.to, ev.scope.pool) == ("2.3.0", "2.4.0", "train-a")
    with pytest.raises(DecodeError, match=r"^kind: unsupported value 'rumour'"):
        codec.decode_change(b'{"v":1,"ts":1,"id":"c","kind":"rumour","scope":{}}')
    alert = {
        "v": 1, "id": "fw-3f9a0c", "status": "firing", "ts": 1764432610.0,
        "onset_ts": 1764432400.0, "detected_ts": 1764432450.0, "severity": "page",
        "scope": {"level": "pool", "pool": "train-a", "model": "llama-70b@v12",
                  "hosts": ["node-017"], "devices": ["node-017/gpu3"], "device_count": 64},
        "layers": ["attention"], "metric": "mfu", "before": 0.47, "after": 0.40,
        "delta_pct": -14.9, "first_failing_stage": "lowering", "bottleneck": "kernel_selection",
        "evidence": [{"stage": "lowering", "indicator": "fallback_frac", "layer": "attention",
                      "before": 0.0, "after": 0.4, "onset_ts": 1764432400.0, "score": 41.2}],
        "suggestion": {"action": "rollback", "change_id": "chg-4821", "kind": "kernel_lib",
                       "from": "2.4.0", "to": "2.3.0", "scope": {"pool": "train-a"},
                       "guardrail": "attention MFU back to >= 0.46 within 6 windows",
                       "confidence": 0.8},
        "summary": "attention MFU -14.9% on pool train-a", "runbook": "docs/runbook.md#x",
    }  # fmt: skip
    decoded = codec.decode_alert(json.dumps(alert).encode())
    assert decoded.suggestion.from_ == "2.4.0"
    assert json.loads(codec.encode(decoded))["suggestion"]["from"] == "2.4.0"
    assert isinstance(decoded, Alert)


def test_schemas_cover_every_record() -> None:
    """`flopwatch schema` has a JSON Schema per record with the required fields."""
    schemas = json_schemas()
    assert set(schemas) == {"window_record", "change_event", "alert"}
    win = schemas["window_record"]["$defs"]["WindowRecord"]
    assert set(win["required"]) == {"v", "ts", "window_s", "device", "layers"}


_json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
)  # fmt: skip
_json = st.recursive(
    _json_leaf,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from([*GOOD, "type", "flops", "busy_s", "x"]), children, max_size=6
        )
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
def _nest(t: tuple[int, bytes, bytes]) -> bytes:
    """`depth` levels of `pair` (its opening and closing halves), placed into `frame`."""
    depth, pair, frame = t
    return frame % (pair[:-1] * depth + pair[-1:] * depth)


_DEEP = st.tuples(
    st.integers(200, 5000),
    st.sampled_from([b"[]", b'{"a":}']),
    st.sampled_from([b"%s", b'{"v":1,"ts":%s}', b'{"v":1,"layers":[%s]}']),
).map(_nest)


@given(st.one_of(st.binary(max_size=200), _json.map(lambda v: json.dumps(v).encode()), _DEEP))
def test_decoder_never_crashes(data: bytes) -> None:
    """Any bytes either decode to a WindowRecord or raise DecodeError with a non-empty reason."""
    reason: str | None = None
    try:
        rec = Codec().decode_window(data)
    except DecodeError as exc:
        reason = exc.reason
    if reason is None:
        assert isinstance(rec, WindowRecord)
    else:
        assert reason
        assert "\n" not in reason


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["layers.0.flops", "layers.0.busy_s", "window_s", "layers.1.busy_s",
                     "ingress.req_rate", "slo.lat_p95_ms", "layers.0.occupancy"]),
    st.one_of(st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
              st.text(max_size=5), st.lists(st.integers(), max_size=2)),
)  # fmt: skip
def test_mutated_field_is_named_in_reason(path: str, value: object) -> None:
    """Corrupting one field of a good record always yields a reason that names that field."""
    data = _with(path, value)
    with pytest.raises(DecodeError) as exc:
        Codec().decode_window(data)
    parts = path.split(".")
    named = parts[0] + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts[1:])
    assert exc.value.reason.startswith(named + ":"), exc.value.reason


def test_encode_is_compact_json() -> None:
    """Encoded records are valid JSON that msgspec and json agree on."""
    rec = Codec().decode_window(json.dumps(GOOD).encode())
    assert json.loads(Codec().encode(rec)) == msgspec.to_builtins(rec)


_GOOD = {"v": 1, "ts": 1_764_432_010.0, "window_s": 10.0, "device": "n0/gpu0", "layers": []}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        # A 2 KB value nested 1,000 deep used to raise RecursionError out of the decoder.
        (b'{"v":1,"x":' + b"[" * 1000 + b"]" * 1000 + b"}", "malformed JSON: nested too deep"),
        # Nested where a typed field is (or as the whole record): the reason's untyped
        # second look at the value used to raise it.
        (b"[" * 1000 + b"]" * 1000, "record: expected an object"),
        (b'{"v":1,"ts":' + b"[" * 1000 + b"]" * 1000 + b"}", "ts: expected a number"),
        (json.dumps({**_GOOD, "ts": 1_764_432_010_000.0}).encode(),
         "ts: expected Unix seconds, got 1764432010000 (milliseconds?)"),
        (json.dumps({**_GOOD, "ts": 1.764432010e15}).encode(), "(microseconds?)"),
        (json.dumps({**_GOOD, "layers": [{"type": "mlp"}] * 3}).encode(),
         "layers[1].type: 'mlp' repeated in one window"),
        (json.dumps({**_GOOD, "layers": [{"type": f"t{i}"} for i in range(300)]}).encode(),
         "layers: 300 entries, over the limit of 256"),
        (b" " * (1 << 20) + json.dumps(_GOOD).encode(), "bytes, over the limit of 1048576"),
    ],
)  # fmt: skip
def test_records_that_cost_or_claim_too_much_are_rejected(value: bytes, reason: str) -> None:
    """Depth, size, layer count, repeated layer types and timestamps in another unit."""
    with pytest.raises(DecodeError) as info:
        Codec().decode_window(value)
    assert reason in info.value.reason


def test_a_change_event_in_milliseconds_is_rejected() -> None:
    ev = {"v": 1, "ts": 1_764_432_010_000, "id": "c", "kind": "driver", "scope": {}}
    with pytest.raises(DecodeError, match="milliseconds"):
        Codec().decode_change(json.dumps(ev).encode())


def _outcome(codec: Codec, value: bytes) -> WindowRecord | str:
    try:
        return codec.decode_window(value)
    except DecodeError as exc:
        return exc.reason


def _batch_outcomes(codec: Codec, values: list[bytes]) -> list[WindowRecord | str]:
    return [r.reason if isinstance(r, DecodeError) else r for r in codec.decode_windows(values)]


def test_a_batch_decodes_as_each_record_alone() -> None:
    """decode_windows gives, per value, what decode_window gives: the record or the same
    reason; a bad record costs none of its neighbours."""
    layer = {"type": "mlp", "cycles": 10.0, "stall_mem_cycles": 4.0}
    tricky = [
        # a repeat after a bad stall (the stall is first) and the other way round
        [dict(layer, type="a", stall_mem_cycles=11.0), dict(layer, type="b"),
         dict(layer, type="b")],
        [dict(layer, type="a"), dict(layer, type="a"),
         dict(layer, type="b", stall_mem_cycles=11.0)],
        [dict(layer, type="a"), dict(layer, type="b"), dict(layer, type="a")],
        # stall within the 1e-6 slack and just past it; stall or cycles missing
        [dict(layer, stall_mem_cycles=10.0 * (1 + 1e-7))],
        [dict(layer, stall_mem_cycles=10.0 * (1 + 5e-6))],
        [{"type": "a", "stall_mem_cycles": 5.0}, {"type": "b", "cycles": 5.0}],
        # too many layers is said before their repeats
        [{"type": "x"}] * 300,
        [],
    ]  # fmt: skip
    values = [json.dumps(GOOD).encode(), *(v for v, _ in BAD)]
    values += [json.dumps({**_GOOD, "layers": ls}).encode() for ls in tricky]
    values += [json.dumps(GOOD).encode()]
    codec = Codec()
    alone = [_outcome(codec, v) for v in values]
    assert _batch_outcomes(codec, values) == alone
    assert isinstance(alone[0], WindowRecord)
    assert isinstance(alone[-1], WindowRecord)
    assert sum(isinstance(a, str) for a in alone) == len(BAD) + 5
    assert _batch_outcomes(codec, []) == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from("abc"),
                                   st.none() | st.sampled_from([0.0, 5.0, 10.0]),
                                   st.none() | st.sampled_from([0.0, 5.0, 10.0, 10.5])),
                         max_size=4),
                max_size=6))  # fmt: skip
def test_batch_layer_checks_match_the_walk(recs: list[list[tuple[str, float | None, float | None]]]
                                           ) -> None:  # fmt: skip
    """Repeated types and stalls above cycles, anywhere in any record of a batch."""
    values = [
        json.dumps({**_GOOD, "layers": [
            {k: v for k, v in (("type", t), ("cycles", c), ("stall_mem_cycles", s))
             if v is not None} for t, c, s in layers]}).encode()
        for layers in recs
    ]  # fmt: skip
    codec = Codec()
    assert _batch_outcomes(codec, values) == [_outcome(codec, v) for v in values]
