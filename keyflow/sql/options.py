"""The ``WITH (…)`` options of each connector: names (Flink's where Flink has one), checks and
did-you-mean. Pure: building the connector from checked options is ``keyflow.sql.tables``."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from keyflow.keygroups import UPPER_BOUND_MAX_PARALLELISM as UPPER_BOUND
from keyflow.sql.errors import SqlError
from keyflow.sql.statements import CreateTable


@dataclass(frozen=True)
class ConnectorSpec:
    """What a connector takes: ``options`` by name, ``field_options`` as ``fields.<column>.<name>``."""

    name: str
    source: bool
    sink: bool
    options: tuple[str, ...]
    field_options: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()  # families passed on as they are (Kafka's ``properties.*``)


_SCAN, _SINK = ("scan.parallelism",), ("sink.parallelism",)
_KAFKA = ("connector", "topic", "properties.bootstrap.servers", "value.format", "key.format", "value.fields-include",
          "sink.delivery-guarantee", "sink.transactional-id-prefix", "scan.rows-per-batch", *_SCAN, *_SINK)  # fmt: skip
PARTITION_COMMIT = (  # read by keyflow.sql.partitioning
    "sink.partition-commit.trigger", "sink.partition-commit.delay", "sink.partition-commit.policy.kind",
    "sink.partition-commit.success-file.name", "sink.partition-commit.watermark-time-zone",
    "partition.time-extractor.kind", "partition.time-extractor.timestamp-pattern",
)  # fmt: skip
# Part files close at every micro-batch, so these upper bounds on how long one stays open hold.
ROLLING = ("sink.rolling-policy.rollover-interval", "sink.rolling-policy.check-interval")
_PARSE_ERRORS = tuple(
    f"{side}{format}.ignore-parse-errors" for side in ("", "value.", "key.") for format in ("json", "csv")
)
CONNECTORS = {
    spec.name: spec
    for spec in (
        ConnectorSpec(
            "datagen",
            source=True,
            sink=False,
            options=("connector", "number-of-rows", "rows-per-second", "seed", "scan.rows-per-batch", *_SCAN),
            field_options=("kind", "min", "max", "start", "end", "length", "exponent", "prefix", "values"),
        ),
        ConnectorSpec(
            "filesystem",
            source=True,
            sink=True,
            options=(
                "connector",
                "path",
                "format",
                "source.watch",
                "source.max-files-per-batch",
                *_SCAN,
                *_SINK,
                *PARTITION_COMMIT,
                *ROLLING,
            ),
            required=("path", "format"),
        ),
        ConnectorSpec(
            "log",
            source=True,
            sink=False,
            options=("connector", "path", "format", "scan.rows-per-batch", *_SCAN),
            required=("path",),
        ),
        ConnectorSpec(
            "upsert-log",
            source=True,
            sink=False,
            options=("connector", "path", "scan.rows-per-batch", *_SCAN),
            required=("path",),
        ),
        ConnectorSpec(
            "kafka",
            source=True,
            sink=True,
            options=(
                *_KAFKA,
                "topic-pattern",
                "format",
                "key.fields",
                "scan.startup.mode",
                "scan.startup.specific-offsets",
                "scan.startup.timestamp-millis",
                *_PARSE_ERRORS,
            ),
            required=("properties.bootstrap.servers",),
            prefixes=("properties.",),
        ),
        ConnectorSpec(
            "upsert-kafka",
            source=True,
            sink=True,
            options=(*_KAFKA, *_PARSE_ERRORS),
            required=("topic", "properties.bootstrap.servers", "key.format", "value.format"),
            prefixes=("properties.",),
        ),
        ConnectorSpec(
            "nexmark",
            source=True,
            sink=False,
            options=(
                "connector",
                "events.num",
                "first-event.rate",
                "next-event.rate",
                "rate.shape",
                "rate.period",
                "rate.limited",
                "person.proportion",
                "auction.proportion",
                "bid.proportion",
                "person.avg-size",
                "auction.avg-size",
                "bid.avg-size",
                "bid.hot-ratio.auctions",
                "bid.hot-ratio.bidders",
                "auction.hot-ratio.sellers",
                "base-time",
                "seed",
                "scan.rows-per-batch",
                *_SCAN,
            ),
        ),
        ConnectorSpec("print", source=False, sink=True, options=("connector", "print-identifier", *_SINK)),
        ConnectorSpec("blackhole", source=False, sink=True, options=("connector", *_SINK)),
    )
}
FILE_FORMATS = ("parquet", "json", "csv")
LOG_FORMATS = ("arrow", "changelog")
# Flink options whose keyflow counterpart has another name: said instead of a plain "unknown".
RENAMED = {
    "source.monitor-interval": "keyflow watches a directory with 'source.watch' = 'true' (new files are read at the "
    "next micro-batch)",
    "fields.*.null-rate": "datagen in keyflow generates no nulls",
    "scan.topic-partition-discovery.interval": "keyflow looks for new Kafka partitions before every micro-batch",
    "sink.partitioner": "keyflow's Kafka sink partitions as Kafka's default partitioner does (murmur2 of the key; "
    "records without a key are spread)",
}


def connector_of(table: CreateTable) -> ConnectorSpec:
    name = table.options["connector"]
    if name not in CONNECTORS:
        close = difflib.get_close_matches(name, list(CONNECTORS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise SqlError(f"{table.where}: connector {name!r} is unknown; {hint}keyflow has {', '.join(CONNECTORS)}")
    return CONNECTORS[name]


def check_options(table: CreateTable) -> ConnectorSpec:
    """Every option of ``table`` is one its connector takes, the required ones are there."""
    spec = connector_of(table)
    for key in table.options:
        if key in spec.options or any(key.startswith(prefix) and len(key) > len(prefix) for prefix in spec.prefixes):
            continue
        parts = key.split(".")
        if spec.field_options and len(parts) == 3 and parts[0] == "fields":
            if parts[1] not in table.column_names:
                raise SqlError(
                    f"{table.where}: option {key!r} names column {parts[1]!r}, not one of {table.column_names}"
                )
            if parts[2] in spec.field_options:
                continue
        _unknown(table, spec, key)
    missing = [key for key in spec.required if key not in table.options]
    if missing:
        raise SqlError(f"{table.where} (connector {spec.name!r}) needs option(s) {', '.join(map(repr, missing))}")
    return spec


def _unknown(table: CreateTable, spec: ConnectorSpec, key: str) -> None:
    generic = "fields.*." + key.split(".")[-1] if key.startswith("fields.") else key
    if generic in RENAMED:
        raise SqlError(f"{table.where}: option {key!r} is not supported: {RENAMED[generic]}")
    known = [*spec.options, *[f"fields.<column>.{name}" for name in spec.field_options]]
    close = difflib.get_close_matches(key, [*spec.options, *_field_names(table, spec)], n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise SqlError(
        f"{table.where}: connector {spec.name!r} has no option {key!r}; {hint}its options: {', '.join(known)}"
    )


def _field_names(table: CreateTable, spec: ConnectorSpec) -> list[str]:
    return [f"fields.{column}.{name}" for column in table.column_names for name in spec.field_options]


def parallelism_option(table: CreateTable, key: str, max_parallelism: int | None) -> int | None:
    """``scan.parallelism``/``sink.parallelism``: a positive integer, at most the max parallelism."""
    value = table.options.get(key)
    if value is None:
        return None
    fix = (
        f"set '{key}' to a whole number from 1 to {max_parallelism or UPPER_BOUND}, "
        "or remove it to use parallelism.default"
    )
    try:
        parsed = int(value.strip())
    except ValueError:
        raise SqlError(f"{table.where}: '{key}' = '{value}' is not an integer; {fix}") from None
    if parsed <= 0:
        raise SqlError(f"{table.where}: '{key}' = '{value}' must be at least 1; {fix}")
    if parsed > (max_parallelism or UPPER_BOUND):
        bound = f"pipeline.max-parallelism {max_parallelism}" if max_parallelism else f"the largest {UPPER_BOUND}"
        raise SqlError(f"{table.where}: '{key}' = '{value}' is above {bound}; {fix}, or raise pipeline.max-parallelism")
    return parsed


def int_option(table: CreateTable, key: str, minimum: int = 0) -> int | None:
    value = table.options.get(key)
    if value is None:
        return None
    try:
        parsed = int(value.strip())
    except ValueError:
        raise SqlError(f"{table.where}: '{key}' = '{value}' is not an integer") from None
    if parsed < minimum:
        raise SqlError(f"{table.where}: '{key}' = '{value}' must be at least {minimum}")
    return parsed


def float_option(table: CreateTable, key: str) -> float | None:
    value = table.options.get(key)
    if value is None:
        return None
    try:
        return float(value.strip())
    except ValueError:
        raise SqlError(f"{table.where}: '{key}' = '{value}' is not a number") from None


def choice_option(table: CreateTable, key: str, choices: tuple[str, ...], default: str) -> str:
    value = table.options.get(key, default).strip().lower()
    if value not in choices:
        raise SqlError(
            f"{table.where}: '{key}' = '{table.options[key]}' is invalid; choose one of {', '.join(choices)}"
        )
    return value


def flag_option(table: CreateTable, key: str) -> bool:
    return choice_option(table, key, ("true", "false"), "false") == "true"
