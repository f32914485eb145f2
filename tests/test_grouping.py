"""Grouping rows by key without a sort (``KeyedBatch.from_rows``), checked against pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyflow import KeyedBatch
from keyflow.state.grouping import grouping_order, key_codes


def expected_groups(frame: pd.DataFrame, keys: list[str]) -> list[tuple[tuple[object, ...], list[int]]]:
    """Each key (as Spark groups it: NaN is one key, -0.0 is 0.0) with its row numbers, keys in
    order of first appearance: an independent answer from pandas."""
    normalized = frame[keys].copy()
    for key in keys:
        if normalized[key].dtype.kind == "f":
            normalized[key] = normalized[key] + 0.0
    groups = normalized.groupby(keys, sort=False, dropna=False).indices
    ordered = sorted(groups.items(), key=lambda item: item[1][0])
    return [(name if isinstance(name, tuple) else (name,), list(rows)) for name, rows in ordered]


def arrow(frame: pd.DataFrame) -> pa.Table:
    """The frame as Arrow with NaN kept as NaN (``from_pandas`` would make it null)."""
    return pa.table({name: pa.array(frame[name].to_numpy(), from_pandas=False) for name in frame.columns})


def same(left: object, right: object) -> bool:
    return left == right or (left != left and right != right)


def check(frame: pd.DataFrame, keys: list[str]) -> None:
    table = arrow(frame)
    key_groups = np.arange(len(frame), dtype=np.int32) % 7
    batch = KeyedBatch.from_rows(table, tuple(keys), key_groups, subtask=3)
    expected = expected_groups(frame, keys)
    assert batch.num_keys == len(expected)
    rows = batch.data.column("row").to_numpy()
    for j, (key, members) in enumerate(expected):
        start, count = batch.starts[j], batch.counts[j]
        assert list(rows[start : start + count]) == members  # each key's rows in arrival order
        got = tuple(batch.keys.column(name)[j].as_py() for name in keys)
        assert all(same(a, b) for a, b in zip(got, key, strict=True))
        assert batch.key_groups[j] == members[0] % 7
    assert list(batch.key_index) == [j for j, (_, members) in enumerate(expected) for _ in members]
    assert batch.subtask == 3


def test_groups_keep_first_appearance_and_arrival_order() -> None:
    frame = pd.DataFrame({"user": ["b", "a", "b", "c", "a", "b"], "row": np.arange(6)})
    check(frame, ["user"])
    batch = KeyedBatch.from_rows(arrow(frame), ("user",), np.zeros(6, np.int32), 0)
    assert batch.keys.column("user").to_pylist() == ["b", "a", "c"]
    assert batch.data.column("row").to_pylist() == [0, 2, 5, 1, 4, 3]


def test_float_keys_group_as_spark_groups_them() -> None:
    """NaN equals NaN and -0.0 equals 0.0, as in Spark's grouping (and in ``from_sorted``)."""
    frame = pd.DataFrame({"k": [0.0, np.nan, -0.0, 1.5, np.nan, 0.0], "row": np.arange(6)})
    codes, distinct = key_codes(arrow(frame), ("k",))
    assert list(codes) == [0, 1, 0, 2, 1, 0]
    assert distinct == 3
    check(frame, ["k"])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-3, 3),
            st.sampled_from(["x", "y", "", "zz"]),
            st.sampled_from([0.0, -0.0, 1.0, float("nan")]),
        ),
        min_size=1,
        max_size=200,
    )
)
def test_multi_column_keys_match_pandas(rows: list[tuple[int, str, float]]) -> None:
    frame = pd.DataFrame(rows, columns=["a", "b", "c"])
    frame["row"] = np.arange(len(frame))
    check(frame, ["a", "b", "c"])
    check(frame, ["b"])


@pytest.mark.parametrize("distinct", [1, 2, 65_536, 65_537, 300_000])
def test_grouping_order_is_a_stable_sort(distinct: int) -> None:
    """More codes than one 16-bit digit holds take a second radix pass."""
    codes = np.random.default_rng(distinct).integers(0, distinct, 400_000)
    order = grouping_order(codes, distinct)
    np.testing.assert_array_equal(order, np.argsort(codes, kind="stable"))
