"""The keyed exchange of a batch job with auto-parallelism (FLIP-187 on Spark's shuffle).

The rows are written once to Spark's shuffle in :func:`subpartitions` subpartitions, each a
contiguous block of key groups (subpartition ``b`` holds the key groups subtask ``b`` would
own at that parallelism). Running only that map stage gives Spark's exact bytes
per subpartition (``MapOutputStatistics``); keyflow decides the parallelism and each subtask's
contiguous subpartition range from them (``keyflow.scheduler.batch_parallelism``), and the
keyed operator reads the same shuffle files, range by range: the input is not read twice.

Spark has no public API for the last two steps; they use the same internals as Spark's own
adaptive execution (``ShuffleExchangeExec.mapOutputStatisticsFuture`` and ``getShuffleRDD``
with ``CoalescedPartitionSpec``), through Py4J.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pyspark.sql import DataFrame

from keyflow.keygroups import key_group_range
from keyflow.runtime.exchange import keyed_exchange
from keyflow.scheduler.batch_parallelism import AutoParallelism, Decision, decide

PER_SUBTASK = 16  # subpartitions per possible subtask: the granularity of balanced ranges
# Every block of every map task costs ~100 bytes of stream framing, counted as input; and
# above 2000 blocks Spark's map statuses keep only average sizes.
MIN_SUBPARTITIONS, MAX_SUBPARTITIONS = 64, 1024
T = TypeVar("T")


@dataclass(frozen=True)
class StageReport:
    """One keyed stage's decision, as ``keyflow run`` reports it."""

    operator_id: int
    operator: str
    decision: Decision
    rows: int  # rows written to the exchange
    max_parallelism: int
    subpartitions: int
    key_groups: tuple[tuple[int, int], ...]  # each subtask's inclusive key-group range
    rdd_id: int | None = None  # the ranged read, whose tasks' metrics give rows per subtask
    subtask_rows: tuple[int, ...] | None = None  # rows each subtask read (after the run)

    def to_dict(self) -> dict[str, Any]:
        d = self.decision
        return {
            "operator_id": self.operator_id,
            "operator": self.operator,
            "input_bytes": d.input_bytes,
            "input_rows": self.rows,
            "broadcast_bytes": d.broadcast_bytes,
            "parallelism": d.parallelism,
            "reason": d.reason,
            "formula_parallelism": d.formula_parallelism,
            "subtasks": [
                {"subtask": i, "key_groups": list(groups), "bytes": load, "rows": rows}
                for i, (groups, load, rows) in enumerate(
                    zip(self.key_groups, d.loads, self.subtask_rows or [None] * len(d.loads), strict=True)
                )
            ],
            "max_to_mean": round(d.max_to_mean, 4),
            "oversized_subpartitions": [
                list(_key_groups(index, index, self.subpartitions, self.max_parallelism)) for index in d.oversized
            ],
        }


def subpartitions(options: AutoParallelism, max_parallelism: int) -> int:
    """How many blocks of key groups the exchange writes: enough to balance the most subtasks
    the options allow, few enough that per-block overhead stays small."""
    wanted = max(MIN_SUBPARTITIONS, PER_SUBTASK * options.max_parallelism)
    return min(max_parallelism, MAX_SUBPARTITIONS, wanted)


def _key_groups(first: int, last: int, count: int, max_parallelism: int) -> tuple[int, int]:
    """The key groups of subpartitions ``first..last`` of ``count``."""
    return key_group_range(max_parallelism, count, first)[0], key_group_range(max_parallelism, count, last)[1]


def adaptive_keyed_exchange(
    frame: DataFrame,
    keys: tuple[str, ...],
    max_parallelism: int,
    options: AutoParallelism,
    operator: tuple[int, str],
    guard: Callable[[Callable[[], T]], T],
    broadcast_bytes: int = 0,
    keep_key_group: bool = True,
    fail_on_null: str | None = None,
) -> tuple[DataFrame, StageReport]:
    """``frame`` exchanged by key group, in as many partitions as the bytes decide: partition
    ``i`` holds exactly the key groups ``report.key_groups[i]``. Runs the map stage now
    (``guard`` turns its failure into keyflow's error). ``operator``: its id and name."""
    count = subpartitions(options, max_parallelism)
    shuffled = keyed_exchange(frame, keys, max_parallelism, count, keep_key_group, fail_on_null)
    spark = frame.sparkSession
    jvm = spark._jvm
    assert jvm is not None
    exchange = _shuffle_exchange(shuffled)
    if exchange is None:  # Spark's optimizer knew the input is empty and planned no shuffle
        decision = replace(decide([0] * count, broadcast_bytes, options), reason="empty input")
        return shuffled, StageReport(
            *operator, decision, 0, max_parallelism, count, (_key_groups(0, count - 1, count, max_parallelism),)
        )
    statistics = guard(
        lambda: jvm.org.apache.spark.util.ThreadUtils.awaitResult(
            exchange.mapOutputStatisticsFuture(), jvm.scala.concurrent.duration.Duration.Inf()
        )
    )
    if statistics is None:  # no map task: an empty input
        decision = replace(decide([0] * count, broadcast_bytes, options), reason="empty input")
    else:
        decision = decide([int(size) for size in statistics.bytesByPartitionId()], broadcast_bytes, options)
    rows = int(exchange.metrics().apply("shuffleRecordsWritten").value())
    specs = spark.sparkContext._gateway.new_array(  # type: ignore[union-attr]
        jvm.org.apache.spark.sql.execution.ShufflePartitionSpec, len(decision.ranges)
    )
    for index, (first, last) in enumerate(decision.ranges):
        specs[index] = jvm.org.apache.spark.sql.execution.CoalescedPartitionSpec(
            first, last + 1, jvm.scala.Option.empty()
        )
    shuffle_rdd = exchange.getShuffleRDD(specs)
    ranged = spark._jsparkSession.internalCreateDataFrame(shuffle_rdd, exchange.schema(), False)
    key_groups = tuple(_key_groups(first, last, count, max_parallelism) for first, last in decision.ranges)
    report = StageReport(*operator, decision, rows, max_parallelism, count, key_groups, shuffle_rdd.id())
    return DataFrame(ranged, spark), report


def _shuffle_exchange(shuffled: DataFrame) -> Any:
    """The physical exchange of ``shuffled`` (planned without Spark's adaptive execution, which
    would hide it behind its own query stages; the shuffles below it, e.g. an aggregate's own,
    then run at ``spark.sql.shuffle.partitions`` without coalescing), or None where Spark
    planned none (an input it knows is empty)."""
    spark = shuffled.sparkSession
    adaptive = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        plan = shuffled._jdf.queryExecution().executedPlan()
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", adaptive)
    node = plan
    while node.getClass().getSimpleName() != "ShuffleExchangeExec":
        if node.children().isEmpty():
            return None
        node = node.children().head()
    return node
