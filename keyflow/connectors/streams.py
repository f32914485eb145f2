"""Unbounded sources: Python streaming data sources for generated rows and the partitioned log.

Spark's Python Data Source API calls ``latestOffset`` on the driver and ``read`` in
workers; offsets are small JSON dicts that Spark stores in its checkpoint, so a restarted
query resumes exactly where the last committed micro-batch ended.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from keyflow.connectors.log import Log
from keyflow.errors import PlanError, positive_option
from keyflow.paths import absolute


class RowRangeReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Row numbers ``0, 1, ...`` released at ``rows_per_second`` up to ``rows`` (if set).

    With ``Trigger.AvailableNow`` every row up to ``rows`` counts as available at once.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.rate = float(options["rows_per_second"])
        self.rows = int(options["rows"]) if options.get("rows") not in (None, "", "None") else None
        self.per_batch = int(options["rows_per_batch"]) if options.get("rows_per_batch") else None
        self.partitions_count = int(options["partitions"])
        self.origin: tuple[float, int] | None = None
        self.target: int | None = None

    def initialOffset(self) -> dict[str, int]:
        return {"row": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_batch) if self.per_batch else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        if self.rows is None:
            raise ValueError("datagen without rows= never ends; give rows=N to run it with available_now")
        self.target = self.rows

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        if self.target is not None:
            end = self.target
        else:
            if self.origin is None:
                self.origin = (time.monotonic(), start["row"])
            since, first = self.origin
            end = first + int((time.monotonic() - since) * self.rate)
            if self.rows is not None:
                end = min(end, self.rows)
        if isinstance(limit, ReadMaxRows):
            end = min(end, start["row"] + limit.max_rows)
        return {"row": max(end, start["row"])}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        first, last = start["row"], end["row"]
        bounds = np.linspace(first, last, self.partitions_count + 1).astype(np.int64)
        return [InputPartition((int(a), int(b))) for a, b in itertools.pairwise(bounds)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        first, last = partition.value
        for chunk in range(first, last, 1 << 20):
            rows = np.arange(chunk, min(last, chunk + (1 << 20)), dtype=np.int64)
            yield pa.RecordBatch.from_arrays([pa.array(rows)], names=["id"])


class RowRangeDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "keyflow-rows"

    def schema(self) -> str:
        return "id bigint"

    def streamReader(self, schema: Any) -> RowRangeReader:
        return RowRangeReader(self.options)


class LogReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads a :class:`keyflow.connectors.log.Log`; the offset is the next record of every split.

    Splits are spread over ``partitions`` Spark partitions (split ``s`` → partition
    ``s % partitions``), so the source's parallelism does not depend on the number of splits.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.log = Log(options["path"])
        self.partitions_count = int(options["partitions"])
        self.per_batch = int(options["rows_per_batch"]) if options.get("rows_per_batch") else None
        self.target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        return {str(split): 0 for split in range(self.log.splits)}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_batch) if self.per_batch else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._ends()

    def _ends(self) -> dict[str, int]:
        return {str(split): end for split, end in enumerate(self.log.end_offsets())}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = self.target or self._ends()
        behind = {split: (start.get(split, 0), end) for split, end in ends.items() if end < start.get(split, 0)}
        if behind:
            raise ValueError(
                f"log {self.log.path} has fewer records than already read (split: (read, now there) {behind}); "
                "it was recreated or truncated. Restore it, or start the pipeline with a new checkpoint"
            )
        if isinstance(limit, ReadMaxRows):
            # Share the limit over the splits with data, smallest backlog first; what a split
            # does not need goes to the next, and the total never exceeds the limit.
            budget, taken = limit.max_rows, {}
            pending = sorted((ends[s] - start.get(s, 0), s) for s in ends if ends[s] > start.get(s, 0))
            for position, (backlog, split) in enumerate(pending):
                taken[split] = min(backlog, budget // (len(pending) - position))
                budget -= taken[split]
            ends = {split: start.get(split, 0) + taken.get(split, 0) for split in ends}
        return ends

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        assigned: list[list[tuple[int, int, int]]] = [[] for _ in range(self.partitions_count)]
        for split, last in end.items():
            first = start.get(split, 0)
            if last > first:
                assigned[int(split) % self.partitions_count].append((int(split), first, last))
        return [InputPartition(json.dumps(ranges)) for ranges in assigned]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for split, first, last in json.loads(partition.value):
            yield from self.log.read(split, first, last)


class LogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "keyflow-log"

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(Log(self.options["path"]).schema)

    def streamReader(self, schema: Any) -> LogReader:
        return LogReader(self.options)


def register(spark: SparkSession) -> None:
    for source in (RowRangeDataSource, LogDataSource):
        spark.dataSource.register(source)


class LogStreamSource:
    """An unbounded source over a :class:`Log`: every appended record, once."""

    unbounded = True

    def __init__(self, path: str, rows_per_batch: int | None) -> None:
        positive_option(rows_per_batch, "log rows_per_batch")
        self.path = absolute(path)
        self.rows_per_batch = rows_per_batch
        self.splits = Log(self.path).splits  # fails early, naming the path, if it is not a log

    def describe(self) -> dict[str, Any]:
        return {"connector": "log", "path": self.path, "splits": self.splits, "rows_per_batch": self.rows_per_batch}

    def read(self, spark: SparkSession, parallelism: int) -> Any:
        raise PlanError(f"log({self.path!r}) is unbounded; run the pipeline with a checkpoint: run(checkpoint=...)")

    def read_stream(self, spark: SparkSession, parallelism: int) -> Any:
        register(spark)
        reader = spark.readStream.format("keyflow-log").option("path", self.path).option("partitions", parallelism)
        if self.rows_per_batch:
            reader = reader.option("rows_per_batch", self.rows_per_batch)
        return reader.load()


def log(path: str, rows_per_batch: int | None = None) -> LogStreamSource:
    """Read a partitioned append-only log (see ``keyflow log append``); unbounded."""
    return LogStreamSource(path, rows_per_batch)
