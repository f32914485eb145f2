"""When a partitioned file sink marks a partition complete: Flink's partition commit.

A partition (``dt=2026-03-01/hm=12%3A00``, Hive-style and escaped as Flink and Spark escape
it) is *pending* from the micro-batch that first writes to it until its trigger says it is
complete; then its policy runs (``success-file``: an empty ``_SUCCESS`` file in it, for the
jobs downstream that wait on one). Pure: the runtime records the pending partitions in each
checkpoint's manifest and calls :meth:`PartitionCommit.due` once per micro-batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import TypedDict
from urllib.parse import unquote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from keyflow.errors import DataError

PROCESS_TIME, PARTITION_TIME = "process-time", "partition-time"
_MICROS = 1_000_000
_OFFSET = re.compile(r"(?:GMT|UTC)?([+-])(\d{1,2})(?::?(\d{2}))?")
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Spark's directory name for a null or empty value
_TIMESTAMP = re.compile(r"(\d{1,10})-(\d{1,2})-(\d{1,2})(?: (\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.(\d{1,9}))?)?")


class Pending(TypedDict):
    """A partition written to and not committed yet; ``created``: the processing time (µs) of the
    micro-batch that first wrote to it."""

    partition: str
    created: int


@dataclass(frozen=True)
class PartitionCommit:
    """Flink's ``sink.partition-commit.*`` and ``partition.time-extractor.*`` options."""

    keys: tuple[str, ...]
    trigger: str = PROCESS_TIME
    delay: int = 0  # microseconds
    success_file: str = "_SUCCESS"
    timestamp_pattern: str | None = None
    time_zone: str | None = None  # None: the session's (spark.sql.session.timeZone), which names the partitions

    def due(
        self, pending: list[Pending], written: list[str], watermark: int | None, now: int, end_of_input: bool
    ) -> tuple[list[str], list[Pending]]:
        """The partitions to commit after a micro-batch that wrote to ``written`` (relative
        partition paths), and those still pending. ``process-time``: once the processing time is
        past the partition's creation plus the delay (at once with no delay, Flink's
        ProcTimeCommitPredicate); ``partition-time``: once the watermark is past the time the
        partition's values name plus the delay (PartitionTimeCommitPredicate). At the end of a
        bounded input every pending partition commits (Flink's ``endInput``)."""
        known = {entry["partition"] for entry in pending}
        pending = [*pending, *(Pending(partition=p, created=now) for p in dict.fromkeys(written) if p not in known)]
        ready = [entry for entry in pending if end_of_input or self._committable(entry, watermark, now)]
        done = {entry["partition"] for entry in ready}
        return [entry["partition"] for entry in ready], [entry for entry in pending if entry["partition"] not in done]

    def _committable(self, entry: Pending, watermark: int | None, now: int) -> bool:
        if self.trigger == PROCESS_TIME:
            return self.delay == 0 or now > entry["created"] + self.delay
        return watermark is not None and watermark > self.partition_time(entry["partition"]) + self.delay

    def partition_time(self, partition: str) -> int:
        """Microseconds since the epoch that ``partition`` stands for (Flink's
        DefaultPartTimeExtractor: ``$key`` in the pattern replaced by the key's value, or the
        first value without a pattern; ``yyyy-M-d[ H:m:s[.fraction]]``, read in the time zone)."""
        values = partition_values(partition)
        nulls = [key for key, value in values.items() if value == DEFAULT_PARTITION]
        if nulls:
            raise DataError(
                f"partition {partition!r}: {nulls[0]} is null or empty, so the partition names no time for its "
                f"commit; filter those rows (WHERE {nulls[0]} IS NOT NULL AND {nulls[0]} <> '') or COALESCE them"
            )
        if self.timestamp_pattern is None:
            text = next(iter(values.values()))
        else:
            text = self.timestamp_pattern
            for key in self.keys:
                text = text.replace(f"${key}", values.get(key, ""))
        match = _TIMESTAMP.fullmatch(text.strip())
        if match is None:
            raise DataError(
                f"partition {partition!r}: its time {text!r} is not 'yyyy-MM-dd[ HH:mm:ss]'; set "
                "'partition.time-extractor.timestamp-pattern' to build one from the partition's values"
            )
        year, month, day, hour, minute, second = (int(part or 0) for part in match.groups()[:6])
        fraction = match.group(7)
        try:  # read leniently, as Flink's extractor: 2026-02-30 is March 2nd
            local = datetime(year + (month - 1) // 12, (month - 1) % 12 + 1, 1) + timedelta(
                days=day - 1, hours=hour, minutes=minute, seconds=second,
                microseconds=int((fraction or "0").ljust(6, "0")[:6]),
            )  # fmt: skip
        except (ValueError, OverflowError):
            raise DataError(f"partition {partition!r}: its time {text!r} is out of range") from None
        instant = local.replace(tzinfo=zone(self.time_zone or "UTC")).astimezone(UTC)
        return int(instant.timestamp()) * _MICROS + instant.microsecond


def zone(name: str) -> tzinfo:
    """A time zone as Java's ``ZoneId.of`` reads one: a region (``Europe/Berlin``), ``UTC``, or an
    offset (``+08:00``, ``GMT-08:00``). Raises ValueError for anything else."""
    offset = _OFFSET.fullmatch(name.strip())
    if offset:
        sign, hours, minutes = offset.groups()
        delta = timedelta(hours=int(hours), minutes=int(minutes or 0))
        return timezone(-delta if sign == "-" else delta)
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r} is not a time zone") from None


def partition_values(partition: str) -> dict[str, str]:
    """``dt=2026-03-01/hm=12%3A00`` -> ``{"dt": "2026-03-01", "hm": "12:00"}``."""
    pairs = (part.split("=", 1) for part in partition.split("/") if "=" in part)
    return {unquote(key): unquote(value) for key, value in pairs}
