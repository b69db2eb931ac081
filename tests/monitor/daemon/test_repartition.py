"""The repartition stage's key: a record's pool, or nothing for the decoder to judge."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from monitor.daemon.repartition import pool_key


def test_the_key_is_the_pool() -> None:
    rec = {"v": 1, "ts": 5.0, "device": "node-1/gpu0", "pool": "train-a", "layers": []}
    assert pool_key(json.dumps(rec).encode()) == b"train-a"


def test_no_key_where_the_pool_cannot_be_read() -> None:
    assert pool_key(b'{"v":1,"ts":') is None  # malformed
    assert pool_key(b'{"v":1,"device":"d"}') is None  # no pool
    assert pool_key(b'{"pool":""}') is None  # empty
    assert pool_key(b'{"pool":7}') is None  # not a string
    assert pool_key(b"[1,2]") is None  # not an object


@given(st.binary(max_size=200))
def test_any_bytes_give_a_key_or_none(value: bytes) -> None:
    key = pool_key(value)
    assert key is None or (isinstance(key, bytes) and key)
