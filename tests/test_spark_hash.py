"""Key groups computed inside Spark (JVM murmur3) equal keyflow's Python ``hash="spark"``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from keyflow.keygroups import assign_to_key_group, assign_to_key_groups, subtasks_for_key_groups
from keyflow.runtime.keygroups import key_group_column, subtask_column

pytestmark = pytest.mark.jvm  # every test here runs Spark

ROWS = 100_000
K = 27720


def mixed_keys(rows: int, seed: int = 7) -> pa.Table:
    """Strings of every length class (ASCII, accented, CJK, emoji, empty, NUL), and
    integers, floats and booleans across their whole ranges, edge values included."""
    rng = np.random.default_rng(seed)
    alphabet = list("abcXYZ09-_ é日本😀\x00")
    lengths = rng.integers(0, 24, rows)
    letters = rng.choice(alphabet, size=int(lengths.sum()))
    cuts = np.cumsum(lengths)[:-1]
    strings = ["".join(chunk) for chunk in np.split(letters, cuts)]
    longs = rng.integers(-(2**63), 2**63 - 1, rows, dtype=np.int64, endpoint=True)
    longs[:4] = [0, -1, -(2**63), 2**63 - 1]
    ints = rng.integers(-(2**31), 2**31 - 1, rows, dtype=np.int32, endpoint=True)
    doubles = rng.normal(0, 1e6, rows)
    doubles[:4] = [0.0, -0.0, np.nan, np.inf]
    return pa.table(
        {
            "s": pa.array(strings, pa.string()),
            "l": pa.array(longs),
            "i": pa.array(ints),
            "d": pa.array(doubles),
            "f": pa.array(doubles.astype(np.float32)),
            "b": pa.array(rng.integers(0, 2, rows).astype(bool)),
        }
    )


@pytest.fixture(scope="module")
def keys_with_spark_groups(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[pa.Table, pa.Table]:
    """The mixed keys written to Parquet, read back by Spark, key groups computed in the JVM."""
    import pyarrow.parquet as pq

    table = mixed_keys(ROWS)
    path = tmp_path_factory.mktemp("keys") / "keys.parquet"
    pq.write_table(table, path)
    frame = spark.read.parquet(str(path))
    columns = [key_group_column([name], K).alias(f"kg_{name}") for name in table.column_names]
    columns.append(key_group_column(["s", "l", "d"], K).alias("kg_composite"))
    groups = frame.select(*columns).toArrow()
    return table, groups


@pytest.mark.parametrize("column", ["s", "l", "i", "d", "f", "b"])
def test_spark_key_groups_equal_python_spark_hash(
    keys_with_spark_groups: tuple[pa.Table, pa.Table], column: str
) -> None:
    table, groups = keys_with_spark_groups
    expected = groups.column(f"kg_{column}").to_numpy()
    assert len(expected) == ROWS
    np.testing.assert_array_equal(assign_to_key_groups(table.column(column), K, hash="spark"), expected)


def test_composite_key_groups_equal_spark(keys_with_spark_groups: tuple[pa.Table, pa.Table]) -> None:
    table, groups = keys_with_spark_groups
    composite = table.select(["s", "l", "d"])
    expected = groups.column("kg_composite").to_numpy()
    np.testing.assert_array_equal(assign_to_key_groups(composite, K, hash="spark"), expected)
    assert assign_to_key_group(tuple(composite.slice(5, 1).to_pylist()[0].values()), K) == expected[5]


def test_key_groups_spread_evenly(keys_with_spark_groups: tuple[pa.Table, pa.Table]) -> None:
    """A sanity check on the hash itself: 100k random longs over 128 groups stay near uniform."""
    table, _ = keys_with_spark_groups
    counts = np.bincount(assign_to_key_groups(table.column("l"), 128), minlength=128)
    assert counts.max() / counts.mean() < 1.15


def test_subtask_column_equals_python(spark: SparkSession) -> None:
    frame = spark.range(K).withColumn("kg", F.col("id").cast("int"))
    for parallelism in (1, 3, 7, 1000):
        spark_subtasks = frame.select(subtask_column(F.col("kg"), K, parallelism)).toArrow().column(0).to_numpy()
        np.testing.assert_array_equal(spark_subtasks, subtasks_for_key_groups(K, parallelism, np.arange(K)))


def test_scalar_spark_hash_of_python_values(spark: SparkSession) -> None:
    """Python int hashes as Spark bigint, str as string, float as double, bool as boolean."""
    values = [("user-42", 42, 1.5, True), ("", -(2**63), -0.0, False)]
    frame = spark.createDataFrame(values, "s string, l bigint, d double, b boolean")
    expected = frame.select(*[key_group_column([c], K) for c in frame.columns]).collect()
    for row, groups in zip(values, expected, strict=True):
        assert [assign_to_key_group(value, K) for value in row] == list(groups)
