"""The (device row, layer type) -> row index agrees with a dict, grid or fallback alike."""

from __future__ import annotations

import numpy as np
from factories import keys_by_row
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core import layer_index
from monitor.core.layer_index import LayerIndex

# Few enough names that some land in the grid and, with a small grid, some beyond it.
_TYPES = [f"t{k}" for k in range(6)]
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 40), st.sampled_from(_TYPES)),
        st.tuples(st.just("drop"), st.integers(0, 200), st.just("")),
        st.tuples(st.just("drop_device"), st.integers(0, 40), st.just("")),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, grid_types=st.sampled_from([2, 32]))
def test_the_index_answers_as_a_dict_would(ops, grid_types) -> None:
    """Adds, removals and device drops in any order: every look-up (one, batched, by row)
    answers as a dict of the same keys, whether a type has a grid column or spilled."""
    old = layer_index.GRID_TYPES
    layer_index.GRID_TYPES = grid_types
    try:
        index, model, free, end = LayerIndex(), {}, [], 0
        for op, a, layer in ops:
            if op == "add" and (a, layer) not in model:
                row = free.pop() if free else end
                end = max(end, row + 1)
                index.add(a, layer, row)
                model[(a, layer)] = row
            elif op == "drop" and model:
                row = model.pop(sorted(model)[a % len(model)])
                index.remove([row])
                free.append(row)
            elif op == "drop_device":
                rows = index.rows_of_devices([a])
                assert rows == sorted(r for (d, _), r in model.items() if d == a)
                index.remove(rows)
                model = {k: r for k, r in model.items() if k[0] != a}
                free.extend(rows)
        assert len(index) == len(model)
        assert dict(index.items()) == model
        assert [r for _, r in index.items()] == sorted(model.values())
        for dev in range(42):
            for t in _TYPES:
                assert index.get((dev, t)) == model.get((dev, t))
        devs = np.array([d for d in range(42) for _ in _TYPES], dtype=np.int64)
        codes = np.array([k for _ in range(42) for k in range(len(_TYPES))], dtype=np.int64)
        want = [model.get((int(d), _TYPES[c]), -1) for d, c in zip(devs, codes, strict=True)]
        assert index.lookup(devs, codes, _TYPES).tolist() == want
        back = LayerIndex.from_columns(*index.columns())
        assert keys_by_row(back) == keys_by_row(index)
        assert back.lookup(devs, codes, _TYPES).tolist() == want
        by_row = keys_by_row(index)
        assert {k: r for r, k in enumerate(by_row) if k is not None} == model
        assert len(by_row) == index.end == end
    finally:
        layer_index.GRID_TYPES = old


def test_a_sender_inventing_type_names_does_not_widen_every_device() -> None:
    """Type names beyond the grid's columns go to the fallback: the grid stays
    `GRID_TYPES` wide however many names arrive, and they still index and free."""
    index = LayerIndex()
    for k in range(layer_index.GRID_TYPES + 50):
        index.add(0, f"junk{k}", k)
    assert len(index.types) == layer_index.GRID_TYPES
    assert index._grid.shape[1] == layer_index.GRID_TYPES
    last = f"junk{layer_index.GRID_TYPES + 49}"
    assert index[(0, last)] == layer_index.GRID_TYPES + 49
    index.remove(list(range(index.end)))
    assert len(index) == 0
    assert index.get((0, last)) is None
    assert not index._spilled
