"""Kafka as a Spark Python streaming data source: a topic partition is a split.

The driver's reader plans each micro-batch: the offset is the next record of every split
(``{"topic:partition": offset}``, kept by Spark in the checkpoint's ``source/`` and committed
with keyflow's state), splits added since the last micro-batch are discovered and read from their
start. A worker reads its splits' offset ranges with one consumer (no consumer group) and
decodes each chunk of records in one Arrow call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from keyflow.changelog import DELETED, OFFSET
from keyflow.connectors.base import MALFORMED_COLUMN, SPLIT_COLUMN
from keyflow.connectors.kafka.client import Brokers, Split, is_retriable, parse_split, split_name, unreachable
from keyflow.connectors.kafka.formats import assemble, decode_aligned
from keyflow.connectors.kafka.options import Client, Formats, Startup
from keyflow.connectors.splits import limited_ends, map_new_splits, pre_keyed_ranges, spread_ranges
from keyflow.errors import DataError, ExternalSystemError, WorkerError
from keyflow.keygroups import KEY_GROUP_COLUMN

FORMAT = "keyflow-kafka"
_CHUNK = 50_000  # records decoded per Arrow call
MALFORMED_TYPE = pa.struct(
    [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()),
     ("value", pa.binary()), ("error", pa.string())]
)  # fmt: skip
MALFORMED_DDL = "STRUCT<topic: STRING, partition: INT, offset: BIGINT, key: BINARY, value: BINARY, error: STRING>"


class ReadSpec:
    """What a reader needs, passed to Spark as one JSON option (``spec``)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.topics: tuple[str, ...] = tuple(spec["topics"])
        self.pattern: str | None = spec["pattern"]
        self.client = Client(spec["servers"], spec["properties"], spec["timeout_s"])
        self.startup = Startup(spec["startup"], spec["timestamp_ms"], {int(k): v for k, v in spec["offsets"].items()})
        self.formats = Formats(**spec["formats"])
        self.columns: list[str] = spec["columns"]
        self.upsert: bool = spec["upsert"]
        self.dead_letters: bool = spec["dead_letters"]
        self.where: str = spec["where"]

    @property
    def committed_only(self) -> bool:
        return self.client.properties.get("isolation.level", "read_committed") == "read_committed"


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str], schema: Any) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.spec = ReadSpec(json.loads(options["spec"]))
        read = to_arrow_schema(schema)
        self.schema = pa.schema([read.field(name) for name in self.spec.columns])  # the decoded columns
        self.layout = options.get("layout")
        self.split_column = options.get("split_column") == "true"
        self.partitions_count = int(options["partitions"])
        self.per_batch = int(options["rows_per_batch"]) if options.get("rows_per_batch") else None
        self.target: dict[str, int] | None = None
        self._brokers: Brokers | None = None

    @property
    def brokers(self) -> Brokers:
        if self._brokers is None:
            self._brokers = Brokers(self.spec.client)
        return self._brokers

    def _guarded(self, call: Any) -> Any:
        try:
            return call()
        except ExternalSystemError as error:
            raise WorkerError(error) from None

    def initialOffset(self) -> dict[str, int]:
        return self._guarded(self._initial)

    def _initial(self) -> dict[str, int]:
        from confluent_kafka.admin import OffsetSpec

        splits = self.brokers.splits(self.spec.topics, self.spec.pattern, self.spec.where)
        startup, committed = self.spec.startup, self.spec.committed_only
        if startup.mode == "latest-offset":
            offsets = self.brokers.offsets(splits, OffsetSpec.latest(), committed)
        elif startup.mode == "timestamp":
            assert startup.timestamp_ms is not None
            offsets = self.brokers.offsets(splits, OffsetSpec.for_timestamp(startup.timestamp_ms), committed)
            ends = self.brokers.offsets(splits, OffsetSpec.latest(), committed)
            offsets = {split: ends[split] if offset < 0 else offset for split, offset in offsets.items()}
        else:
            offsets = self.brokers.offsets(splits, OffsetSpec.earliest(), committed)
            if startup.mode == "specific-offsets":
                offsets.update({s: startup.specific_offsets[s[1]] for s in splits if s[1] in startup.specific_offsets})
            elif startup.mode == "group-offsets":
                offsets = self._group_offsets(splits, offsets)
        return {split_name(split): offsets[split] for split in splits}

    def _group_offsets(self, splits: list[Split], earliest: dict[Split, int]) -> dict[Split, int]:
        from confluent_kafka.admin import OffsetSpec

        group = self.spec.client.properties["group.id"]
        committed = self.brokers.committed(group, splits)
        reset = self.spec.client.properties.get("auto.offset.reset")
        lacking = [split for split in splits if split not in committed]
        if lacking and reset not in ("earliest", "latest", "smallest", "largest"):
            raise ExternalSystemError(
                f"{self.spec.where}: consumer group {group!r} has no committed offset for {len(lacking)} partition(s) "
                f"(e.g. {split_name(lacking[0])}) and 'properties.auto.offset.reset' is not set; set it to 'earliest' "
                "or 'latest', or choose another 'scan.startup.mode'"
            )
        if lacking and reset in ("latest", "largest"):
            latest = self.brokers.offsets(lacking, OffsetSpec.latest(), self.spec.committed_only)
        else:
            latest = earliest
        return {split: committed.get(split, latest.get(split, 0)) for split in splits}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_batch) if self.per_batch else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._guarded(lambda: self._ends(None))

    def _ends(self, start: dict[str, int] | None) -> dict[str, int]:
        """The last stable offset of every split: those of ``start`` first, then any split
        discovered since (a topic's added partitions, or a new topic the pattern matches)."""
        from confluent_kafka.admin import OffsetSpec

        found = self.brokers.splits(self.spec.topics, self.spec.pattern, self.spec.where)
        known = [parse_split(name) for name in (start or {})]
        splits = known + [split for split in found if split not in set(known)]
        if self.layout is not None:
            splits = splits[: len(map_new_splits(self.layout, len(splits), self.spec.where))]
        ends = self.brokers.offsets(splits, OffsetSpec.latest(), self.spec.committed_only)
        return {split_name(split): ends[split] for split in splits}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = self.target or self._guarded(lambda: self._ends(start))
        behind = {split: (start[split], end) for split, end in ends.items() if end < start.get(split, 0)}
        if behind:
            raise WorkerError(
                ExternalSystemError(
                    f"{self.spec.where} has fewer records than already read (partition: (read, there now) {behind}); "
                    "the topic was deleted and created again. Start the pipeline with a new checkpoint"
                )
            )
        return limited_ends(start, ends, limit.max_rows) if isinstance(limit, ReadMaxRows) else ends

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        names = list(end)
        ranges = [(i, start.get(name, 0), end[name]) for i, name in enumerate(names) if end[name] > start.get(name, 0)]
        if self.layout is not None:
            assigned = pre_keyed_ranges(self.layout, ranges, self.spec.where)
        else:
            assigned = spread_ranges(ranges, self.partitions_count)
        return [InputPartition(json.dumps([[names[r[0]], *r] for r in part])) for part in assigned]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        ranges = json.loads(partition.value)
        if not ranges:
            return
        try:
            yield from _read_ranges(self.spec, self.schema, ranges, self.layout is not None, self.split_column)
        except (ExternalSystemError, DataError) as error:
            raise WorkerError(error) from None

    def commit(self, end: dict[str, int]) -> None:
        return None


def _read_ranges(
    spec: ReadSpec, schema: pa.Schema, ranges: list[list[Any]], pre_keyed: bool, split_column: bool
) -> Iterator[pa.RecordBatch]:
    """Records ``[first, end)`` of each split, decoded, in chunks."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        spec.client.config(
            **{
                "group.id": "keyflow-reader",  # required by the client; nothing is committed to it
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed" if spec.committed_only else "read_uncommitted",
                "max.partition.fetch.bytes": 16 << 20,
            }
        )
    )
    try:
        for name, index, first, end, key_group in ranges:
            split = parse_split(name)
            for records in _split_records(consumer, spec, split, first, end):
                batch = _decoded(spec, schema, split, records)
                if pre_keyed:
                    batch = batch.append_column(KEY_GROUP_COLUMN, pa.array(np.full(len(batch), key_group, np.int32)))
                if split_column:
                    batch = batch.append_column(SPLIT_COLUMN, pa.array(np.full(len(batch), index, np.int32)))
                yield from batch.to_batches()
    finally:
        consumer.close()


def _split_records(consumer: Any, spec: ReadSpec, split: Split, first: int, end: int) -> Iterator[list[Any]]:
    """The records of ``split`` from ``first`` to ``end`` in chunks, read with ``consumer``
    (one split at a time: a chunk needs no sorting by split, and only its last offset is
    checked against the end)."""
    from confluent_kafka import KafkaError, TopicPartition

    consumer.assign([TopicPartition(split[0], split[1], first)])
    position, deadline = first, time.monotonic() + spec.client.timeout_s
    while position < end:
        # As many as are left: the call returns once they are there (or the partition's end
        # is), instead of waiting out its timeout for a fuller chunk.
        messages = consumer.consume(min(_CHUNK, end - position), 0.2)
        records = [message for message in messages if message.error() is None]
        if len(records) < len(messages):
            for message in messages:
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    if is_retriable(error) and time.monotonic() < deadline:
                        continue  # a broker restarting: the consumer reconnects and fetches again
                    raise unreachable(spec.client, error.str())
                if error is not None and message.offset() >= end:
                    position = end  # the end of the range is a transaction marker
        if records:
            last = records[-1].offset()
            if last >= end:  # records after the range (offsets grow within a split)
                records = [record for record in records if record.offset() < end]
            position = max(position, min(last + 1, end))
        if records:
            yield records
        if messages:
            deadline = time.monotonic() + spec.client.timeout_s
        elif time.monotonic() > deadline:
            raise unreachable(spec.client, f"no records from {split_name(split)} of {spec.where}")


def _decoded(spec: ReadSpec, schema: pa.Schema, split: Split, records: list[Any]) -> pa.Table:
    """The rows of one split's records; a malformed record fails the batch (naming it) unless
    parse errors are ignored. Tombstones (no value) are deletes for upsert-kafka, else skipped."""
    formats, fields = spec.formats, schema
    value_schema = pa.schema([fields.field(name) for name in formats.value_columns(tuple(fields.names))])
    values, bad, has_value = decode_aligned([record.value() for record in records], formats.value, value_schema)
    keys = None
    if formats.key is not None:
        key_schema = pa.schema([fields.field(name) for name in formats.key_fields])
        keys, bad_keys, _ = decode_aligned([record.key() for record in records], formats.key, key_schema)
        bad |= bad_keys
    if bad.any() and not formats.ignore_parse_errors and not spec.dead_letters:
        first = records[int(np.argmax(bad))]
        shown = (first.value() or first.key() or b"")[:120]
        raise DataError(
            f"{spec.where}: {int(bad.sum())} malformed {formats.value} record(s) in topic {split[0]!r} partition "
            f"{split[1]}, the first at offset {first.offset()}: {shown!r}. Nothing of the micro-batch was committed; "
            f"fix the producer, send them to dead letters (dead_letters=parquet(...)), or set "
            f"'{formats.value}.ignore-parse-errors' = 'true' to skip them"
        )
    keep = ~bad & (has_value | spec.upsert)
    if spec.dead_letters:
        keep |= bad
    kept = pa.array(keep)
    missing = pa.array(~has_value).filter(kept)
    table = assemble(fields, values.filter(kept), None if keys is None else keys.filter(kept), missing)
    if spec.upsert:
        offsets = pa.array([record.offset() for record in records], pa.int64()).filter(kept)
        table = table.append_column(OFFSET, offsets).append_column(DELETED, missing)
    if spec.dead_letters:
        table = table.append_column(MALFORMED_COLUMN, _malformed(split, records, bad, formats.value).filter(kept))
    return table


def _malformed(split: Split, records: list[Any], bad: np.ndarray, format: str) -> pa.Array:
    """Per record: null, or where a malformed one came from, its bytes and why (dead letters)."""
    chosen = np.flatnonzero(bad)
    picked = [records[i] for i in chosen]
    rows = pa.StructArray.from_arrays(
        [
            pa.array([split[0]] * len(picked), pa.string()),
            pa.array([split[1]] * len(picked), pa.int32()),
            pa.array([record.offset() for record in picked], pa.int64()),
            pa.array([record.key() for record in picked], pa.binary()),
            pa.array([record.value() for record in picked], pa.binary()),
            pa.array([f"not a {format} record of the source's columns"] * len(picked), pa.string()),
        ],
        fields=list(MALFORMED_TYPE),
    )
    position = np.full(len(records), -1, np.int64)
    position[chosen] = np.arange(len(chosen))
    return rows.take(pa.array(position, mask=position < 0))


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return self.options["ddl"]

    def streamReader(self, schema: Any) -> KafkaStreamReader:
        return KafkaStreamReader(self.options, schema)


def register(spark: SparkSession) -> None:
    spark.dataSource.register(KafkaDataSource)
