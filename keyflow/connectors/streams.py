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
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from keyflow.changelog import MODES, OFFSET, OP
from keyflow.connectors.base import SPLIT_COLUMN
from keyflow.connectors.log import Log, check_key_columns
from keyflow.connectors.splits import limited_ends, map_new_splits, pre_keyed_ranges, spread_ranges
from keyflow.errors import PlanError, positive_option
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.paths import absolute
from keyflow.schemas import Type, schema_columns


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
    A pre-keyed log (option ``layout``: a file the job rewrites when it rescales) is read as
    its keyed operators need it: partition ``i`` reads the splits whose key groups subtask
    ``i`` owns, and each row carries its split's key group.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.log = Log(options["path"])
        self.layout = options.get("layout")
        self.offsets = options.get("offsets") == "true"
        self.split_column = options.get("split_column") == "true"
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
        self.log.refresh()  # splits added while running are read too
        if self.offsets and self.log.keyed_by is None:
            raise ValueError(
                f"log {self.log.path} is read as a changelog by its primary key, but it is no longer split by a key "
                "(splits were added, or an append had no key=), so the changes of a key may be in several splits "
                "and lose their order; write the changes to a new log with key= (keyflow log append --key)"
            )
        ends = self.log.end_offsets()
        if self.layout is not None:
            ends = ends[: len(map_new_splits(self.layout, self.log.splits, f"log {self.log.path}"))]
        return {str(split): end for split, end in enumerate(ends)}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = self.target or self._ends()
        behind = {split: (start.get(split, 0), end) for split, end in ends.items() if end < start.get(split, 0)}
        if behind:
            raise ValueError(
                f"log {self.log.path} has fewer records than already read (split: (read, now there) {behind}); "
                "it was recreated or truncated. Restore it, or start the pipeline with a new checkpoint"
            )
        return limited_ends(start, ends, limit.max_rows) if isinstance(limit, ReadMaxRows) else ends

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        ranges = [(int(split), start.get(split, 0), last) for split, last in end.items() if last > start.get(split, 0)]
        if self.layout is not None:
            assigned = pre_keyed_ranges(self.layout, ranges, f"log {self.log.path}")
        else:
            assigned = spread_ranges(ranges, self.partitions_count)
        return [InputPartition(json.dumps(split_ranges)) for split_ranges in assigned]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for split, first, last, key_group in json.loads(partition.value):
            for batch in self.log.read(split, first, last, self.offsets):
                if self.layout is not None:
                    column = pa.array(np.full(batch.num_rows, key_group, dtype=np.int32))
                    batch = batch.append_column(KEY_GROUP_COLUMN, column)
                if self.split_column:
                    batch = batch.append_column(SPLIT_COLUMN, pa.array(np.full(batch.num_rows, split, dtype=np.int32)))
                yield batch


class LogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "keyflow-log"

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = Log(self.options["path"]).schema
        if self.options.get("offsets") == "true":
            schema = schema.append(pa.field(OFFSET, pa.int64()))
        if self.options.get("layout"):
            schema = schema.append(pa.field(KEY_GROUP_COLUMN, pa.int32()))
        if self.options.get("split_column") == "true":
            schema = schema.append(pa.field(SPLIT_COLUMN, pa.int32()))
        return from_arrow_schema(schema)

    def streamReader(self, schema: Any) -> LogReader:
        return LogReader(self.options)


def register(spark: SparkSession) -> None:
    for source in (RowRangeDataSource, LogDataSource):
        spark.dataSource.register(source)


def row_numbers(
    spark: SparkSession, parallelism: int, rows_per_second: float, rows: int | None, rows_per_batch: int | None
) -> DataFrame:
    """A stream of row numbers ``id`` released at ``rows_per_second`` up to ``rows``, in
    ``parallelism`` partitions per micro-batch (generated sources compute their rows from it)."""
    register(spark)
    options = {"rows_per_second": rows_per_second, "rows": rows, "rows_per_batch": rows_per_batch}
    reader = spark.readStream.format("keyflow-rows").option("partitions", parallelism)
    return reader.options(**{key: str(value) for key, value in options.items() if value is not None}).load()


class LogStreamSource:
    """An unbounded source over a :class:`Log`: every appended record, once.

    ``changelog_mode``: ``insert`` (rows are inserts), ``upsert`` (a row replaces the row of
    its primary key; non-key columns all null delete it) or ``all`` (rows carry a row kind in
    ``op``). A changelog with a ``primary_key`` is normalized by it (keyed state), so it
    stays correct at any parallelism."""

    unbounded = True

    def __init__(
        self,
        path: str,
        rows_per_batch: int | None,
        changelog_mode: str = "insert",
        primary_key: tuple[str, ...] = (),
    ) -> None:
        positive_option(rows_per_batch, "log rows_per_batch")
        self.path = absolute(path)
        self.rows_per_batch = rows_per_batch
        described = Log(self.path)  # fails early, naming the path, if it is not a log
        self.splits, self.schema = described.splits, described.schema
        if changelog_mode not in MODES:
            raise PlanError(f"log changelog_mode={changelog_mode!r} is invalid; choose one of {', '.join(MODES)}")
        if (changelog_mode == "all") != (OP in self.schema.names):
            has = "has" if OP in self.schema.names else "has no"
            raise PlanError(
                f"log {path} {has} an {OP!r} column, so it is {'a' if has == 'has' else 'not a'} changelog; read it "
                + ("with changelog_mode='all' (SQL: 'format' = 'changelog')" if has == "has" else
                   "with changelog_mode='insert' or 'upsert' (SQL: 'format' = 'arrow' or connector 'upsert-log')")
            )  # fmt: skip
        check_key_columns(list(primary_key), self.schema)
        if changelog_mode == "upsert" and not primary_key:
            raise PlanError(f"log {path} in upsert mode needs its primary key: primary_key=('id',)")
        split_by = described.keyed_by
        if (
            changelog_mode != "insert"
            and primary_key
            and not (split_by is not None and set(split_by) <= set(primary_key))
        ):
            how = f"split by {list(split_by)}" if split_by else "not split by a key (some append had no key=)"
            raise PlanError(
                f"log {path} is {how}, so the changes of a primary key {list(primary_key)} may be in several splits "
                "and their order is lost; write the log with key= (keyflow log append --key) set to primary key "
                "columns"
            )
        self.changelog_mode, self.primary_key = changelog_mode, tuple(primary_key)

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "connector": "log",
            "path": self.path,
            "splits": self.splits,
            "rows_per_batch": self.rows_per_batch,
        }
        if self.changelog_mode != "insert":
            described.update(changelog_mode=self.changelog_mode, primary_key=list(self.primary_key))
        return described

    def read(self, spark: SparkSession, parallelism: int) -> Any:
        raise PlanError(f"log({self.path!r}) is unbounded; run the pipeline with a checkpoint: run(checkpoint=...)")

    def column_names(self) -> tuple[str, ...]:
        return tuple(self.schema.names)

    def column_types(self) -> dict[str, Type]:
        return schema_columns(self.schema) or {}

    def current_splits(self) -> int:
        """The log's number of splits now (splits may be added while a pipeline runs)."""
        return Log(self.path).splits

    def read_stream(
        self, spark: SparkSession, parallelism: int, layout: str | None = None, split_column: bool = False
    ) -> Any:
        """The log as a streaming DataFrame; with ``layout`` (see :func:`write_layout`) read
        pre-keyed: each subtask reads the splits of its key groups, rows carry the key group;
        with ``split_column`` rows carry their split (for per-split watermarks)."""
        register(spark)
        reader = spark.readStream.format("keyflow-log").option("path", self.path).option("partitions", parallelism)
        if layout is not None:
            reader = reader.option("layout", layout)
        if self.changelog_mode != "insert":
            reader = reader.option("offsets", "true")
        if split_column:
            reader = reader.option("split_column", "true")
        if self.rows_per_batch:
            reader = reader.option("rows_per_batch", self.rows_per_batch)
        return reader.load()


def log(
    path: str,
    rows_per_batch: int | None = None,
    changelog_mode: str = "insert",
    primary_key: str | tuple[str, ...] | list[str] = (),
) -> LogStreamSource:
    """Read a partitioned append-only log (see ``keyflow log append``); unbounded.

    ``changelog_mode="upsert"`` with ``primary_key`` reads it as upserts and deletes of each
    key; ``"all"`` reads a log whose ``op`` column holds row kinds (+I, -U, +U, -D)."""
    keys = (primary_key,) if isinstance(primary_key, str) else tuple(primary_key)
    return LogStreamSource(path, rows_per_batch, changelog_mode, keys)
