"""Exchanges on Spark: keyed (exact key-group routing), rebalance and partition counts.

Spark's ``repartition(n, col)`` sends a row to partition ``pmod(hash(col), n)``. To make
subtask ``i`` land in partition ``i`` exactly, every row carries a *routing value*: the
smallest int whose Spark hash lands in partition ``i``. keyflow computes those values in
Python with its bit-exact copy of Spark's hash, so routing is exact, uses Spark's native
shuffle, and no partition is shared or left empty by hash collisions.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from keyflow.keygroups import assign_to_key_groups
from keyflow.runtime.keygroups import key_group_column, subtask_column

KEY_GROUP = "__keyflow_key_group"
_ROUTE = "__keyflow_route"


@lru_cache(maxsize=64)
def routing_values(parallelism: int) -> tuple[int, ...]:
    """For each partition ``i < parallelism``, the smallest int ``r`` with ``pmod(hash(r), p) == i``."""
    found: dict[int, int] = {}
    start = 0
    while len(found) < parallelism:
        candidates = np.arange(start, start + 16 * parallelism + 64, dtype=np.int32)
        partitions = assign_to_key_groups(candidates, parallelism, hash="spark")
        _, first = np.unique(partitions, return_index=True)
        for index in first:
            found.setdefault(int(partitions[index]), int(candidates[index]))
        start += len(candidates)
    return tuple(found[partition] for partition in range(parallelism))


def route_column(subtask: Column, parallelism: int) -> Column:
    values = F.array(*[F.lit(value) for value in routing_values(parallelism)])
    return F.element_at(values, subtask + F.lit(1))


def keyed_exchange(frame: DataFrame, keys: tuple[str, ...], max_parallelism: int, parallelism: int) -> DataFrame:
    """Repartition so Spark partition ``i`` holds exactly subtask ``i``'s key groups.

    Adds the key group as a column (``KEY_GROUP``) for the keyed operator downstream.
    """
    key_group = key_group_column(list(keys), max_parallelism)
    with_group = frame.withColumn(KEY_GROUP, key_group)
    subtask = subtask_column(F.col(KEY_GROUP), max_parallelism, parallelism)
    return with_group.repartition(parallelism, route_column(subtask, parallelism).alias(_ROUTE))


def rebalance(frame: DataFrame, parallelism: int) -> DataFrame:
    """Round-robin to ``parallelism`` partitions (Flink's rebalance)."""
    return frame.repartition(parallelism)


def with_partitions(frame: DataFrame, parallelism: int) -> DataFrame:
    """Exactly ``parallelism`` partitions: coalesce if more (no shuffle), rebalance if fewer."""
    current = frame.rdd.getNumPartitions()
    if current == parallelism:
        return frame
    return frame.coalesce(parallelism) if current > parallelism else rebalance(frame, parallelism)
