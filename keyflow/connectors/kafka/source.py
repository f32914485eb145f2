"""Kafka sources: ``kafka(...)`` (records are inserts) and ``upsert_kafka(...)`` (a compacted
topic as a changelog by its key: a record replaces its key's row, a tombstone deletes it), with
Flink's option names in SQL (``keyflow.sql.tables`` builds them from ``WITH (…)``)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from keyflow.changelog import DELETED, OFFSET
from keyflow.connectors.base import Sink
from keyflow.connectors.kafka.options import Client, Formats, Startup, specific_offsets, split_list
from keyflow.errors import PlanError, positive_option
from keyflow.schemas import Type, schema_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("keyflow")


class KafkaSource:
    """An unbounded source over Kafka topics; each topic partition is a split (see
    ``keyflow.connectors.kafka.reader``). With one ``topic`` it can be read pre-keyed
    (``reinterpret_as_keyed``) when its producer partitioned records by key."""

    unbounded = True

    def __init__(
        self,
        topics: tuple[str, ...],
        pattern: str | None,
        schema: str,
        client: Client,
        startup: Startup,
        formats: Formats,
        rows_per_batch: int | None = None,
        primary_key: tuple[str, ...] = (),
        dead_letters: Sink | None = None,
    ) -> None:
        if bool(topics) == (pattern is not None):
            raise PlanError(
                "a Kafka source reads 'topic' (one or a list 'a;b') or 'topic-pattern', exactly one of them"
            )
        columns = schema_columns(schema)
        if not columns:
            raise PlanError(f"Kafka source schema {schema!r} is not a DDL column list such as 'user STRING, n BIGINT'")
        where = f"Kafka source {self._label(topics, pattern)}"
        formats.check_columns(tuple(columns), where)
        if primary_key:
            missing = [name for name in primary_key if name not in columns]
            if missing:
                raise PlanError(f"{where}: primary key {missing} is not among its columns {list(columns)}")
            if set(formats.key_fields) != set(primary_key):
                raise PlanError(
                    f"{where} (upsert-kafka): the record key holds {list(formats.key_fields)}, the primary key is "
                    f"{list(primary_key)}; they must be the same columns (Flink's upsert-kafka: key.fields = the key)"
                )
        if startup.mode == "group-offsets" and "group.id" not in client.properties:
            raise PlanError(
                f"{where}: 'scan.startup.mode' = 'group-offsets' (Flink's default) needs 'properties.group.id'; set "
                "it, or start at 'earliest-offset' or 'latest-offset'"
            )
        positive_option(rows_per_batch, "Kafka scan.rows-per-batch")
        if dead_letters is not None and not isinstance(dead_letters, Sink):
            raise PlanError(f"{where}: dead_letters={dead_letters!r} is not a sink; pass e.g. parquet('out/malformed')")
        self.dead_letters = dead_letters
        self.topics, self.pattern, self.schema, self.columns = topics, pattern, schema, columns
        self.client, self.startup, self.formats = client, startup, formats
        self.rows_per_batch, self.primary_key = rows_per_batch, primary_key
        self.where = where
        self._brokers: Any = None  # one admin connection for the driver's per-micro-batch questions

    @staticmethod
    def _label(topics: tuple[str, ...], pattern: str | None) -> str:
        return f"topic-pattern {pattern!r}" if pattern is not None else f"topic {';'.join(topics)!r}"

    @property
    def marks_deletes(self) -> bool:
        """upsert-kafka: a tombstone deletes its key (as Flink), not a record with null columns."""
        return bool(self.primary_key)

    @property
    def changelog_mode(self) -> str:
        return "upsert" if self.primary_key else "insert"

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "connector": "upsert-kafka" if self.primary_key else "kafka",
            **({"topic-pattern": self.pattern} if self.pattern else {"topic": ";".join(self.topics)}),
            "properties.bootstrap.servers": self.client.bootstrap_servers,
            "value.format": self.formats.value,
        }
        if not self.primary_key:
            described["scan.startup.mode"] = self.startup.mode
        if self.formats.key:
            described.update({"key.format": self.formats.key, "key.fields": ";".join(self.formats.key_fields)})
        if self.primary_key:
            described.update(changelog_mode="upsert", primary_key=list(self.primary_key))
        if self.dead_letters is not None:
            described["dead_letters"] = self.dead_letters.describe()
        return described

    def column_names(self) -> tuple[str, ...]:
        return tuple(self.columns)

    def column_types(self) -> dict[str, Type]:
        return dict(self.columns)

    def read(self, spark: SparkSession, parallelism: int) -> Any:
        raise PlanError(f"{self.where} is unbounded; run the pipeline with a checkpoint: run(checkpoint=...)")

    def current_splits(self) -> int:
        """The partitions of the topic(s) now (partitions may be added while a pipeline runs)."""
        from keyflow.connectors.kafka.client import Brokers

        if self._brokers is None:
            self._brokers = Brokers(self.client)
        return len(self._brokers.splits(self.topics, self.pattern, self.where))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_brokers": None}  # a client connection stays in its process

    def read_stream(
        self, spark: SparkSession, parallelism: int, layout: str | None = None, split_column: bool = False
    ) -> DataFrame:
        """A streaming DataFrame; ``layout``: read pre-keyed (see ``keyflow.connectors.splits``);
        ``split_column``: each row's split (per-partition watermarks)."""
        from keyflow.connectors.kafka.reader import FORMAT, register

        if layout is not None and (self.pattern is not None or len(self.topics) != 1):
            raise PlanError(f"{self.where} is read pre-keyed, which needs exactly one topic: its partitions are splits")
        splits = self.current_splits()  # the broker answers (or a bounded error) before the query starts
        if parallelism > splits:
            log.warning(
                "%s has %d partition(s) and runs at scan parallelism %d: %d subtask(s) will idle (as in Flink)",
                self.where, splits, parallelism, parallelism - splits,
            )  # fmt: skip
        register(spark)
        from keyflow.connectors.base import MALFORMED_COLUMN, SPLIT_COLUMN
        from keyflow.connectors.kafka.reader import MALFORMED_DDL
        from keyflow.keygroups import KEY_GROUP_COLUMN

        upsert = bool(self.primary_key)
        hidden = [
            (OFFSET, "BIGINT", upsert),
            (DELETED, "BOOLEAN", upsert),
            (KEY_GROUP_COLUMN, "INT", layout is not None),
        ]
        hidden.append((SPLIT_COLUMN, "INT", split_column))
        hidden.append((MALFORMED_COLUMN, MALFORMED_DDL, self.dead_letters is not None))
        ddl = ", ".join([self.schema, *(f"`{name}` {kind}" for name, kind, wanted in hidden if wanted)])
        spec = {
            "topics": list(self.topics), "pattern": self.pattern, "servers": self.client.bootstrap_servers,
            "properties": self.client.properties, "timeout_s": self.client.timeout_s, "startup": self.startup.mode,
            "timestamp_ms": self.startup.timestamp_ms, "offsets": self.startup.specific_offsets,
            "formats": asdict(self.formats), "columns": list(self.columns), "upsert": bool(self.primary_key),
            "where": self.where, "dead_letters": self.dead_letters is not None,
        }  # fmt: skip
        options = {"spec": json.dumps(spec), "ddl": ddl, "partitions": str(parallelism)}
        if layout is not None:
            options["layout"] = layout
        if split_column:
            options["split_column"] = "true"
        if self.rows_per_batch:
            options["rows_per_batch"] = str(self.rows_per_batch)
        reader = spark.readStream.format(FORMAT).options(**options)
        return reader.load()


def kafka(
    topic: str | list[str] | None = None,
    *,
    bootstrap_servers: str,
    schema: str,
    format: str = "json",
    topic_pattern: str | None = None,
    startup_mode: str = "group-offsets",
    startup_timestamp_millis: int | None = None,
    startup_specific_offsets: str | None = None,
    key_format: str | None = None,
    key_fields: str | list[str] | None = None,
    value_fields_include: str = "ALL",
    ignore_parse_errors: bool = False,
    properties: dict[str, str] | None = None,
    rows_per_batch: int | None = None,
    timeout_s: float = 30.0,
    dead_letters: Sink | None = None,
) -> KafkaSource:
    """Read Kafka topics (Flink's ``kafka`` connector; each option is named after Flink's:
    ``startup_mode`` is ``scan.startup.mode``, ``properties`` are ``properties.*``). ``schema``
    is a DDL column list; records decode with ``format`` (json, csv, raw). Unbounded; each
    partition is a split, its offsets kept in the checkpoint. ``dead_letters``: a sink for
    records that do not decode (topic, partition, offset, key, value, error)."""
    return KafkaSource(
        split_list(topic),
        topic_pattern,
        schema,
        Client.of(bootstrap_servers, properties, timeout_s),
        Startup(startup_mode, startup_timestamp_millis, specific_offsets(startup_specific_offsets or "")),
        Formats(format, key_format, split_list(key_fields), value_fields_include, ignore_parse_errors),
        rows_per_batch,
        dead_letters=dead_letters,
    )


def upsert_kafka(
    topic: str,
    *,
    bootstrap_servers: str,
    schema: str,
    primary_key: str | list[str],
    key_format: str = "json",
    value_format: str = "json",
    value_fields_include: str = "ALL",
    ignore_parse_errors: bool = False,
    properties: dict[str, str] | None = None,
    rows_per_batch: int | None = None,
    timeout_s: float = 30.0,
    dead_letters: Sink | None = None,
) -> KafkaSource:
    """Read a compacted topic as a changelog by ``primary_key`` (Flink's ``upsert-kafka``): a
    record replaces its key's row, a tombstone (a null value) deletes it. Always read from the
    earliest offset, as Flink does; normalized by the key (keyed state), so any parallelism is right."""
    keys = split_list(primary_key)
    return KafkaSource(
        split_list(topic),
        None,
        schema,
        Client.of(bootstrap_servers, properties, timeout_s),
        Startup("earliest-offset"),
        Formats(value_format, key_format, keys, value_fields_include, ignore_parse_errors),
        rows_per_batch,
        primary_key=keys,
        dead_letters=dead_letters,
    )
