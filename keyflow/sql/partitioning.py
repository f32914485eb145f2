"""A filesystem table's ``PARTITIONED BY`` and Flink's partition-commit options, checked and
read into a :class:`PartitionCommit` before Spark starts."""

from __future__ import annotations

import re

from keyflow.config import parse_duration
from keyflow.connectors.partition_commit import PARTITION_TIME, PROCESS_TIME, PartitionCommit, zone
from keyflow.errors import ConfigError
from keyflow.sql.errors import SqlError
from keyflow.sql.options import PARTITION_COMMIT, ROLLING, choice_option
from keyflow.sql.statements import CreateTable


def partition_commit_of(table: CreateTable) -> PartitionCommit | None:
    """The commit policy of a partitioned filesystem sink (None: no policy, nothing commits)."""
    options = table.options
    for key in ROLLING:
        if key in options:
            _micros(table, key)
    given = [key for key in PARTITION_COMMIT if key in options]
    if given and not table.partition_keys:
        raise SqlError(f"{table.where}: option(s) {given} commit partitions, and the table has none; declare "
                       "PARTITIONED BY (…) or remove them")  # fmt: skip
    policy = options.get("sink.partition-commit.policy.kind")
    if policy is None:
        return None
    kinds = [kind.strip().lower() for kind in policy.split(",")]
    if kinds != ["success-file"]:
        raise SqlError(
            f"{table.where}: 'sink.partition-commit.policy.kind' = '{policy}': keyflow commits partitions with "
            "'success-file' only (it has no metastore, and runs no custom policy class)"
        )
    choice_option(table, "partition.time-extractor.kind", ("default",), "default")
    pattern = options.get("partition.time-extractor.timestamp-pattern")
    unknown = [name for name in re.findall(r"\$(\w+)", pattern or "") if name not in table.partition_keys]
    if unknown:
        named = ", ".join("$" + name for name in unknown)
        raise SqlError(f"{table.where}: 'partition.time-extractor.timestamp-pattern' = '{pattern}' names {named}, "
                       f"not partition keys {list(table.partition_keys)}")  # fmt: skip
    time_zone = options.get("sink.partition-commit.watermark-time-zone")
    try:
        zone(time_zone or "UTC")
    except ValueError:
        raise SqlError(f"{table.where}: 'sink.partition-commit.watermark-time-zone' = '{time_zone}' is not a time "
                       "zone; write e.g. 'UTC', 'Europe/Berlin' or 'GMT-08:00'") from None  # fmt: skip
    return PartitionCommit(
        keys=table.partition_keys,
        trigger=choice_option(table, "sink.partition-commit.trigger", (PROCESS_TIME, PARTITION_TIME), PROCESS_TIME),
        delay=_micros(table, "sink.partition-commit.delay") if "sink.partition-commit.delay" in options else 0,
        success_file=options.get("sink.partition-commit.success-file.name", "_SUCCESS"),
        timestamp_pattern=pattern,
        time_zone=time_zone,
    )


def _micros(table: CreateTable, key: str) -> int:
    try:
        return round(parse_duration(f"'{key}'", table.options[key]) * 1_000_000)
    except ConfigError as error:
        raise SqlError(f"{table.where}: {error}") from None
