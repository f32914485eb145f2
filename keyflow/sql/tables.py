"""Build keyflow's sources and sinks from ``CREATE TABLE … WITH (…)``, options checked first."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from keyflow.changelog import OP
from keyflow.config import parse_size
from keyflow.connectors.base import Sink, Source
from keyflow.connectors.kafka.options import Client, Formats, Startup, specific_offsets, split_list
from keyflow.errors import ConfigError, PlanError
from keyflow.sql.errors import SqlError
from keyflow.sql.options import (
    check_options,
    choice_option,
    flag_option,
    float_option,
    int_option,
)
from keyflow.sql.statements import CreateTable

FLINK_DATAGEN_RATE = 10_000.0  # Flink's rows-per-second default for an unbounded datagen
_INTEGERS = ("TINYINT", "SMALLINT", "INT", "INTEGER", "BIGINT")


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def schema_ddl(table: CreateTable) -> str:
    return ", ".join(f"{quoted(column.name)} {column.type}" for column in table.columns)


def source_of(table: CreateTable) -> Source:
    """The source reading ``table``, with its computed columns."""
    if table.computed and table.options["connector"] in ("upsert-log", "upsert-kafka", "log"):
        raise SqlError(
            f"{table.where}: computed columns on a '{table.options['connector']}' table are not supported yet; "
            "compute them in a view over the table"
        )
    source = _source(table)
    if not table.computed:
        return source
    from keyflow.connectors.computed import ComputedColumns

    return ComputedColumns(source, table.computed)


def _source(table: CreateTable) -> Source:
    spec = check_options(table)
    if not spec.source:
        raise SqlError(f"{table.where} (connector {spec.name!r}) can only be written to, not read FROM")
    if spec.name != "filesystem":
        _not_partitioned(table, spec.name)
    if spec.name == "datagen":
        return _datagen(table)
    if spec.name == "filesystem":
        from keyflow.connectors.files import files

        format = choice_option(table, "format", ("parquet", "json", "csv"), "parquet")
        options = {}
        per_batch = int_option(table, "source.max-files-per-batch", minimum=1)
        if per_batch is not None:
            options["maxFilesPerTrigger"] = str(per_batch)
        return files(table.options["path"], format, schema_ddl(table), flag_option(table, "source.watch"), **options)
    if spec.name in ("kafka", "upsert-kafka"):
        return _kafka_source(table)
    if spec.name == "nexmark":
        return _nexmark(table)
    return _log(table, "upsert" if spec.name == "upsert-log" else None)


def sink_of(table: CreateTable) -> Sink:
    """The sink writing ``table``."""
    spec = check_options(table)
    if not spec.sink:
        raise SqlError(f"{table.where} (connector {spec.name!r}) can only be read FROM, not written to")
    if spec.name == "filesystem":
        from keyflow.connectors.files import FileSink
        from keyflow.sql.partitioning import partition_commit_of

        format = choice_option(table, "format", ("parquet", "json", "csv"), "parquet")
        return FileSink(table.options["path"], format, {}, table.partition_keys, partition_commit_of(table))
    _not_partitioned(table, spec.name)
    if spec.name in ("kafka", "upsert-kafka"):
        return _kafka_sink(table)
    from keyflow.connectors.console import blackhole, print_rows

    return print_rows(table.options.get("print-identifier")) if spec.name == "print" else blackhole()


def _not_partitioned(table: CreateTable, connector: str) -> None:
    if table.partition_keys:
        raise SqlError(f"{table.where}: PARTITIONED BY {list(table.partition_keys)} is for 'filesystem' tables "
                       f"(partition directories); connector {connector!r} has no partitions to declare")  # fmt: skip


def _log(table: CreateTable, mode: str | None) -> Source:
    from keyflow.connectors.streams import log

    if mode is None:
        mode = "all" if choice_option(table, "format", ("arrow", "changelog"), "arrow") == "changelog" else "insert"
    if mode == "upsert" and not table.primary_key:
        raise SqlError(
            f"{table.where} (connector 'upsert-log') needs a primary key: a row replaces the row of its key; "
            "declare PRIMARY KEY (…) NOT ENFORCED"
        )
    source = log(table.options["path"], int_option(table, "scan.rows-per-batch", 1), mode, table.primary_key)
    stored = [name for name in source.schema.names if name != OP]
    if stored != table.column_names:
        raise SqlError(
            f"{table.where}: the log at {table.options['path']} has columns {stored}, the table declares "
            f"{table.column_names}; declare the log's columns in its order"
        )
    return source


def _nexmark(table: CreateTable) -> Source:
    """Flink Nexmark's ``nexmark`` table: its option names, a constant event rate."""
    from keyflow.connectors.nexmark import COLUMNS, nexmark

    if table.column_names != list(COLUMNS):
        raise SqlError(
            f"{table.where} (connector 'nexmark') declares {table.column_names}; the nexmark connector has the "
            f"columns {list(COLUMNS)} (ROW types as in Nexmark's DDL), then computed columns"
        )
    rate = float_option(table, "first-event.rate")
    float_option(table, "next-event.rate")  # checked; as in Flink's Nexmark today it has no effect
    events = int_option(table, "events.num")
    settings: dict[str, Any] = {
        "events": events or None,  # as Flink's Nexmark: 0 (or none) is unbounded
        "rate_limited": flag_option(table, "rate.limited"),
        "first_event_rate": rate,
        "person_proportion": int_option(table, "person.proportion", 1),
        "auction_proportion": int_option(table, "auction.proportion", 1),
        "bid_proportion": int_option(table, "bid.proportion", 1),
        "hot_auction_ratio": int_option(table, "bid.hot-ratio.auctions", 1),
        "hot_bidders_ratio": int_option(table, "bid.hot-ratio.bidders", 1),
        "hot_sellers_ratio": int_option(table, "auction.hot-ratio.sellers", 1),
        "avg_person_byte_size": _bytes(table, "person.avg-size"),
        "avg_auction_byte_size": _bytes(table, "auction.avg-size"),
        "avg_bid_byte_size": _bytes(table, "bid.avg-size"),
        "base_time": table.options.get("base-time"),
        "seed": int_option(table, "seed"),
        "rows_per_batch": int_option(table, "scan.rows-per-batch", 1),
    }
    with _named(table):
        return nexmark(**{key: value for key, value in settings.items() if value is not None or key == "events"})


def _bytes(table: CreateTable, key: str) -> int | None:
    """A memory size as Flink writes it (``200b``, ``1kb``), read as the configuration reads one."""
    value = table.options.get(key)
    if value is None:
        return None
    try:
        return parse_size(f"'{key}'", value)
    except ConfigError:
        raise SqlError(f"{table.where}: '{key}' = '{value}' is not a size; write e.g. '200b' or '1kb'") from None


@contextmanager
def _named(table: CreateTable) -> Iterator[None]:
    """A connector's PlanError as a SqlError naming the table and its position."""
    try:
        yield
    except SqlError:
        raise
    except PlanError as error:
        raise SqlError(f"{table.where}: {error}") from None


def _kafka_parts(table: CreateTable) -> tuple[Client, Formats]:
    """The brokers, client properties and formats of a ``kafka`` or ``upsert-kafka`` table."""
    upsert = table.options["connector"] == "upsert-kafka"
    options = table.options
    if upsert and not table.primary_key:
        raise SqlError(
            f"{table.where} (connector 'upsert-kafka') needs a primary key: records are keyed by it; declare "
            "PRIMARY KEY (…) NOT ENFORCED"
        )
    if not upsert and table.primary_key:
        raise SqlError(
            f"{table.where}: the 'kafka' connector does not take a PRIMARY KEY (as in Flink: it cannot keep its "
            "meaning); use 'connector' = 'upsert-kafka' to read or write a topic by key"
        )
    if "format" in options and "value.format" in options:
        raise SqlError(f"{table.where}: give 'format' or 'value.format', not both ('format' is short for it)")
    properties = {
        key.removeprefix("properties."): value
        for key, value in options.items()
        if key.startswith("properties.") and key != "properties.bootstrap.servers"
    }
    parse_errors = [key for key in options if key.endswith("ignore-parse-errors")]
    with _named(table):
        formats = Formats(
            options.get("value.format", options.get("format", "json")),
            options.get("key.format"),
            table.primary_key if upsert else split_list(options.get("key.fields")),
            options.get("value.fields-include", "ALL"),
            any(flag_option(table, key) for key in parse_errors),
        )
        formats.check_columns(tuple(table.column_names), table.where)
        return Client(options["properties.bootstrap.servers"], properties), formats


def _kafka_source(table: CreateTable) -> Source:
    from keyflow.connectors.kafka.source import KafkaSource

    client, formats = _kafka_parts(table)
    options = table.options
    upsert = options["connector"] == "upsert-kafka"
    with _named(table):
        startup = Startup(
            "earliest-offset" if upsert else options.get("scan.startup.mode", "group-offsets"),
            int_option(table, "scan.startup.timestamp-millis"),
            specific_offsets(options.get("scan.startup.specific-offsets", "")),
        )
        return KafkaSource(
            split_list(options.get("topic")), options.get("topic-pattern"), schema_ddl(table), client, startup, formats,
            int_option(table, "scan.rows-per-batch", 1), table.primary_key if upsert else (),
        )  # fmt: skip


def _kafka_sink(table: CreateTable) -> Sink:
    from keyflow.connectors.kafka.sink import KafkaSink

    client, formats = _kafka_parts(table)
    options = table.options
    if "topic-pattern" in options or "topic" not in options:
        raise SqlError(f"{table.where}: a Kafka sink writes one topic: give 'topic' (not 'topic-pattern')")
    with _named(table):
        return KafkaSink(
            options["topic"], client, formats, options.get("sink.delivery-guarantee", "at-least-once"),
            options.get("sink.transactional-id-prefix"), table.primary_key,
        )  # fmt: skip


def _datagen(table: CreateTable) -> Source:
    from keyflow.connectors.datagen import datagen

    fields, ends = {}, []
    for column in table.columns:
        fields[column.name], end = _field(table, column.name, column.type.upper())
        if end is not None:
            ends.append(end)
    rows = int_option(table, "number-of-rows")
    rate = float_option(table, "rows-per-second")
    if ends:  # Flink: the source ends when any sequence does
        rows = min([*ends, *([rows] if rows is not None else [])])
    if rows is None and rate is None:
        rate = FLINK_DATAGEN_RATE
    return datagen(rows, fields, int_option(table, "seed") or 0, rate, int_option(table, "scan.rows-per-batch", 1))


def _field(table: CreateTable, column: str, kind: str) -> tuple[Any, int | None]:
    """The generator of one column and, for a sequence with an end, how many rows it has."""
    from keyflow.connectors import datagen as gen

    def option(name: str) -> str | None:
        return table.options.get(f"fields.{column}.{name}")

    def number(name: str, default: float) -> float:
        value = float_option(table, f"fields.{column}.{name}")
        return default if value is None else value

    generator = (option("kind") or "random").strip().lower()
    integer = kind.split("(")[0] in _INTEGERS
    if generator == "sequence":
        if not integer:
            raise SqlError(
                f"{table.where}: 'fields.{column}.kind' = 'sequence' needs an integer column, {column!r} is {kind}; "
                "generate an integer sequence and compute from it in the query"
            )
        for bound in ("start", "end"):  # as Flink's DataGenTableSourceFactory: a sequence has both
            if option(bound) is None:
                raise SqlError(
                    f"{table.where}: could not find required option 'fields.{column}.{bound}' for the sequence "
                    f"generator of column {column!r}; give both 'fields.{column}.start' and 'fields.{column}.end'"
                )
        start, end = int(number("start", 0)), int(number("end", 0))
        if end < start:
            raise SqlError(f"{table.where}: 'fields.{column}.end' = '{end}' is below 'fields.{column}.start' = "
                           f"'{start}'; a sequence counts up from start to end")  # fmt: skip
        return gen.sequence(start), end - start + 1
    if generator == "zipf":
        return gen.zipf(int(number("max", 1000)), number("exponent", 1.1), option("prefix")), None
    if generator != "random":
        raise SqlError(
            f"{table.where}: 'fields.{column}.kind' = '{generator}' is invalid; choose random, sequence or zipf"
        )
    if option("values") is not None:
        return gen.choice([value.strip() for value in str(option("values")).split(",")]), None
    if integer or kind.startswith(("DOUBLE", "FLOAT", "REAL", "DECIMAL")):
        low, high = number("min", 0), number("max", 1_000_000 if integer else 1000.0)
        if high < low:
            raise SqlError(f"{table.where}: 'fields.{column}.max' = '{option('max')}' is below 'fields.{column}.min'"
                           f" = '{low:g}'; give max >= min")  # fmt: skip
        return (gen.random_int(int(low), int(high)) if integer else gen.random_float(low, high)), None
    if kind in ("STRING",):
        length = int(number("length", 16))
        if not 1 <= length <= 64:
            raise SqlError(f"{table.where}: 'fields.{column}.length' = '{length}' is out of range; keyflow "
                           "generates strings of 1 to 64 characters (Flink's default is 100)")  # fmt: skip
        return gen.random_string(length), None
    if kind == "BOOLEAN":
        return gen.choice([True, False]), None
    if kind.startswith(("TIMESTAMP", "DATE")):
        return gen.timestamp(step_ms=1000), None
    raise SqlError(
        f"{table.where}: datagen cannot generate column {column!r} of type {kind}; generate a supported type "
        "(integers, DOUBLE, DECIMAL, STRING, BOOLEAN, TIMESTAMP, DATE) and cast it in the query"
    )
