"""Key groups as Spark column expressions, computed in the JVM with no Python UDF."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from keyflow.keygroups import check_max_parallelism, check_parallelism


def key_group_column(keys: list[str | Column], max_parallelism: int) -> Column:
    """``pmod(hash(k1, k2, ...), K)``: the same value as ``assign_to_key_groups(..., hash="spark")``."""
    max_parallelism = check_max_parallelism(max_parallelism)
    if not keys:
        raise ValueError("a key needs at least one column")
    return F.pmod(F.hash(*keys), F.lit(max_parallelism))


def subtask_column(key_group: Column, max_parallelism: int, parallelism: int) -> Column:
    """``key_group * p div K``: the subtask owning each key group (Flink's contiguous ranges)."""
    parallelism, max_parallelism = check_parallelism(parallelism, max_parallelism)
    return ((key_group.cast("long") * parallelism) / max_parallelism).cast("long").cast("int")
