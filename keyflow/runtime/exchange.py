"""Exchanges on Spark: keyed (exact key-group routing) and rebalance.

Spark's ``repartition(n, col)`` sends a row to partition ``pmod(hash(col), n)``. To make
subtask ``i`` land in partition ``i`` exactly, every row carries a *routing value*: the
smallest int whose Spark hash lands in partition ``i``. keyflow computes those values in
Python with its bit-exact copy of Spark's hash, so routing is exact, uses Spark's native
shuffle, and no partition is shared or left empty by hash collisions.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from pyspark import SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from keyflow.keygroups import KEY_GROUP_COLUMN, assign_to_key_groups
from keyflow.runtime.keygroups import key_group_column, subtask_column

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


def keyed_exchange(
    frame: DataFrame,
    keys: tuple[str, ...],
    max_parallelism: int,
    parallelism: int,
    keep_key_group: bool = True,
    fail_on_null: str | None = None,
) -> DataFrame:
    """Repartition so Spark partition ``i`` holds exactly subtask ``i``'s key groups.

    With ``keep_key_group`` the key group stays as a column (``KEY_GROUP_COLUMN``) for the keyed
    operator downstream. With ``fail_on_null``, a row whose key has a null stops the job
    with that message.
    """
    key_group, route, check = _routing(keys, max_parallelism, parallelism, keep_key_group, fail_on_null, _jvm())
    if keep_key_group:
        frame = frame.withColumn(KEY_GROUP_COLUMN, key_group)
    if check is not None:  # Spark's one-partition exchange never evaluates its expression
        frame = frame.filter(check)
    return frame.repartition(parallelism, route)


def _jvm() -> int:
    """Which JVM the columns belong to (a cache key: columns are JVM objects)."""
    return id(SparkContext._gateway)


@lru_cache(maxsize=256)
def _routing(
    keys: tuple[str, ...],
    max_parallelism: int,
    parallelism: int,
    keep_key_group: bool,
    fail_on_null: str | None,
    jvm: int,
) -> tuple[Column, Column, Column | None]:
    """The key-group column, the routing column and (at parallelism 1 with ``fail_on_null``) a
    filter that checks nulls: built once per shape, because each Py4J call to build a column
    costs ~1 ms, ~0.1 s per exchange that a streaming job would pay every micro-batch."""
    key_group = key_group_column(list(keys), max_parallelism)
    routed_key_group = F.col(KEY_GROUP_COLUMN) if keep_key_group else key_group
    route = route_column(subtask_column(routed_key_group, max_parallelism, parallelism), parallelism)
    check = None
    if fail_on_null is not None:
        raise_on_null = F.when(null_key_condition(keys), F.raise_error(F.lit(fail_on_null)))
        if parallelism == 1:
            check = raise_on_null.otherwise(F.lit(True))
        route = raise_on_null.otherwise(route)
    return key_group, route.alias(_ROUTE), check


def null_key_condition(keys: tuple[str, ...]) -> Column:
    """True where any key column is null."""
    condition = F.col(keys[0]).isNull()
    for key in keys[1:]:
        condition = condition | F.col(key).isNull()
    return condition


def rebalance(frame: DataFrame, parallelism: int) -> DataFrame:
    """Round-robin to ``parallelism`` partitions (Flink's rebalance)."""
    return frame.repartition(parallelism)
