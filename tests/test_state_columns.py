"""State columns against a plain Python model: random writes (with nulls, overwrites, keys
never written) and reads in any slot order must read back the last value written, for
fixed-width (NumPy) and variable-width (Arrow chunks) types alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from keyflow.state.memory import ArrowColumn, NumpyColumn, state_column

ROW = pa.struct([("name", pa.string()), ("n", pa.int64())])
TYPES = {
    "int64": (pa.int64(), lambda rng: int(rng.integers(-5, 5))),
    "string": (pa.string(), lambda rng: "s" * int(rng.integers(0, 4))),
    "list of rows": (pa.list_(ROW), lambda rng: [{"name": f"k{i}", "n": i} for i in range(int(rng.integers(0, 3)))]),
    "map": (pa.map_(pa.string(), pa.int64()), lambda rng: [("a", int(rng.integers(0, 9)))]),
}


@pytest.mark.parametrize("name", list(TYPES))
def test_a_column_reads_back_the_last_write_of_each_slot(name: str) -> None:
    arrow_type, value = TYPES[name]
    column = state_column(arrow_type)
    assert isinstance(column, NumpyColumn if name == "int64" else ArrowColumn)
    rng = np.random.default_rng(7)
    model: dict[int, Any] = {}
    size = 0
    for _ in range(300):
        size = max(size, int(rng.integers(1, 400)))
        column.grow(size)
        slots = rng.choice(size, size=int(rng.integers(0, min(size, 60) + 1)), replace=False).astype(np.int64)
        values = [None if rng.random() < 0.2 else value(rng) for _ in slots]
        column.set(slots, pa.array(values, arrow_type))
        model.update(zip(slots.tolist(), values, strict=True))
        read = rng.integers(0, size, int(rng.integers(0, 80))).astype(np.int64)  # any order, repeats
        got = column.get(read)
        assert got.type == arrow_type
        assert got.to_pylist() == [model.get(slot) for slot in read.tolist()]  # a map reads back as pairs
    valid = column.valid(size)
    assert valid.tolist() == [model.get(slot) is not None for slot in range(size)]
    if isinstance(column, ArrowColumn):
        assert len(column._order) <= 12  # merged as a binary counter: O(log writes) chunks
        live = sum(v is not None for v in model.values())
        assert sum(len(values) for values, _ in column._chunks.values()) <= 2 * live + 1024 + 60


def test_a_write_of_the_wrong_length_is_refused() -> None:
    column = state_column(pa.list_(pa.int64()))
    column.grow(3)
    with pytest.raises(ValueError, match="state update has 1 values for 2 keys; give one per key"):
        column.set(np.array([0, 1]), pa.array([[1]], pa.list_(pa.int64())))
