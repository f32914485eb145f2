"""The aggregate that runs in the worker after reinterpret_as_keyed (``RunningAggregate``),
driven through the real ``KeyedRunner`` over Arrow batches in arrival order, against pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.runtime.aggregates import RunningAggregate
from keyflow.runtime.changelog import Retracting
from keyflow.runtime.workers import KeyedRunner, KeyedTask
from keyflow.state.durable import MemoryState

AGGREGATES = (
    Retracting("rows", "count", None),
    Retracting("priced", "count", "price"),
    Retracting("total", "sum", "price"),
    Retracting("units", "sum", "qty"),
    Retracting("mean", "avg", "price"),
    Retracting("low", "min", "price"),
    Retracting("high", "max", "price"),
    Retracting("first_tag", "min", "tag"),
)
OUTPUT = pa.schema(
    [
        ("user", pa.string()),
        ("rows", pa.int64()),
        ("priced", pa.int64()),
        ("total", pa.float64()),
        ("units", pa.int64()),
        ("mean", pa.float64()),
        ("low", pa.float64()),
        ("high", pa.float64()),
        ("first_tag", pa.string()),
    ]
)


def rows(count: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    price = rng.uniform(0, 10, count)
    price[rng.random(count) < 0.05] = np.nan  # NaN: Spark's max is NaN, its min skips it
    return pd.DataFrame(
        {
            "user": rng.choice([f"u{n}" for n in range(37)], count),
            "price": price,
            "missing": rng.random(count) < 0.1,  # a null price: skipped by count(x), sum, avg, min, max
            "qty": rng.integers(-5, 50, count),
            "tag": rng.choice(["b", "a", "c"], count),
        }
    )


def run(frame: pd.DataFrame, batch_rows: int) -> pd.DataFrame:
    table = pa.table(
        {
            "user": frame.user,
            "price": pa.array(frame.price.to_numpy(), mask=frame.missing.to_numpy(), from_pandas=False),
            "qty": frame.qty,
            "tag": frame.tag,
            KEY_GROUP_COLUMN: pa.array(np.zeros(len(frame), np.int32)),
        }
    )
    function = RunningAggregate(("user",), AGGREGATES)
    types = pa.schema([table.schema.field(name) for name in ("price", "qty", "tag")])
    task = KeyedTask("aggregate 'a'", OUTPUT, ("user",), function.state(AGGREGATES, types), 1, 1, MemoryState())
    runner = KeyedRunner(function, task)
    out = pa.Table.from_batches(list(runner(iter(table.to_batches(max_chunksize=batch_rows)))), schema=OUTPUT)
    return out.to_pandas().sort_values("user", ignore_index=True)


def expected(frame: pd.DataFrame) -> pd.DataFrame:
    """Spark's answer, computed per user in plain Python and NumPy."""
    answers = []
    for user, group in frame.groupby("user"):
        values = group.price[~group.missing].to_numpy()
        numbers = values[~np.isnan(values)]
        some = len(values) > 0
        answers.append(
            {
                "user": user,
                "rows": len(group),
                "priced": len(values),
                "total": values.sum() if some else None,
                "units": int(group.qty.sum()),
                "mean": values.sum() / len(values) if some else None,
                "low": (numbers.min() if len(numbers) else np.nan) if some else None,
                "high": (np.nan if np.isnan(values).any() else values.max()) if some else None,
                "first_tag": min(group.tag),
            }
        )
    return pd.DataFrame(answers).sort_values("user", ignore_index=True)


@pytest.mark.parametrize("batch_rows", [3, 64, 5_000])
def test_each_key_once_with_spark_semantics(batch_rows: int) -> None:
    """Keys spread over many calls still come out once each; nulls are skipped, NaN is Spark's
    (the maximum, and skipped by min)."""
    frame = rows(2_000, seed=batch_rows)
    got = run(frame, batch_rows)
    assert got.user.is_unique
    pd.testing.assert_frame_equal(got, expected(frame), check_dtype=False, rtol=1e-9)


def test_an_integer_sum_beyond_64_bits_fails_as_in_spark() -> None:
    frame = pd.DataFrame(
        {"user": ["u", "u"], "price": [1.0, 2.0], "missing": [False, False], "qty": [2**62, 2**62], "tag": ["a", "a"]}
    )
    with pytest.raises(RuntimeError, match="overflows a 64-bit integer"):
        run(frame, 10)


def test_a_nan_key_stays_nan_and_an_all_nan_group_is_nan() -> None:
    """Spark groups NaN keys together and emits them as NaN (not null); a key whose values are
    all NaN has NaN as both its min and its max."""
    keys = [np.nan, 1.0, np.nan, 1.0, -0.0, 0.0]
    values = [np.nan, 2.0, np.nan, np.nan, 3.0, 4.0]
    table = pa.table({"k": keys, "v": values, KEY_GROUP_COLUMN: pa.array(np.zeros(len(keys), np.int32))})
    aggregates = (Retracting("n", "count", None), Retracting("low", "min", "v"), Retracting("high", "max", "v"))
    output = pa.schema([("k", pa.float64()), ("n", pa.int64()), ("low", pa.float64()), ("high", pa.float64())])
    function = RunningAggregate(("k",), aggregates)
    state = function.state(aggregates, pa.schema([table.schema.field("v")]))
    runner = KeyedRunner(function, KeyedTask("aggregate 'a'", output, ("k",), state, 1, 1, MemoryState()))
    got = pa.Table.from_batches(list(runner(iter(table.to_batches(max_chunksize=2)))), schema=output).to_pylist()
    nan, one, zero = got
    assert nan["k"] is not None  # the NaN key, first seen first: NaN, not null
    assert np.isnan([nan["k"], nan["low"], nan["high"]]).all()
    assert nan["n"] == 2
    assert (one["k"], one["n"], one["low"]) == (1.0, 2, 2.0)
    assert np.isnan(one["high"])  # NaN is Spark's max
    assert zero == {"k": 0.0, "n": 2, "low": 3.0, "high": 4.0}  # -0.0 and 0.0 are one key
