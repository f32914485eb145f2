"""Kafka options as Flink's Kafka and upsert-Kafka connectors name them, checked before Spark
starts: the Python API (``kafka(...)``) and SQL (``'connector' = 'kafka'``) both build these."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from keyflow.errors import PlanError

FORMATS = ("json", "csv", "raw")
STARTUP_MODES = ("earliest-offset", "latest-offset", "group-offsets", "timestamp", "specific-offsets")
FIELDS_INCLUDE = ("ALL", "EXCEPT_KEY")
DELIVERY_GUARANTEES = ("at-least-once", "exactly-once", "none")
_SPECIFIC = re.compile(r"^\s*partition\s*:\s*(\d+)\s*,\s*offset\s*:\s*(\d+)\s*$")


def choice(value: str, choices: tuple[str, ...], what: str) -> str:
    """``value`` if it is one of ``choices`` (case-insensitive), else an error with a did-you-mean."""
    for candidate in choices:
        if value.strip().lower() == candidate.lower():
            return candidate
    close = difflib.get_close_matches(value.strip(), choices, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise PlanError(f"{what} = {value!r} is invalid; {hint}choose one of {', '.join(choices)}")


@dataclass(frozen=True)
class Formats:
    """How records' keys and values become columns: ``value`` format of every column (or all but
    the key fields, ``EXCEPT_KEY``), ``key`` format of the ``key_fields``."""

    value: str = "json"
    key: str | None = None
    key_fields: tuple[str, ...] = ()
    value_fields_include: str = "ALL"
    ignore_parse_errors: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", choice(self.value, FORMATS, "'value.format'"))
        if self.key is not None:
            object.__setattr__(self, "key", choice(self.key, FORMATS, "'key.format'"))
        object.__setattr__(
            self, "value_fields_include", choice(self.value_fields_include, FIELDS_INCLUDE, "'value.fields-include'")
        )
        if self.key_fields and self.key is None:
            raise PlanError(f"'key.fields' = {';'.join(self.key_fields)!r} needs 'key.format' (json, csv or raw)")
        if self.key is not None and not self.key_fields:
            raise PlanError("'key.format' is set but 'key.fields' is not; name the key columns: 'key.fields' = 'a;b'")
        if self.value_fields_include == "EXCEPT_KEY" and not self.key_fields:
            raise PlanError("'value.fields-include' = 'EXCEPT_KEY' needs 'key.fields' and 'key.format'")

    def check_columns(self, columns: tuple[str, ...], where: str) -> None:
        missing = [name for name in self.key_fields if name not in columns]
        if missing:
            raise PlanError(f"{where}: 'key.fields' names {missing}, which are not columns of {list(columns)}")
        for format, names in ((self.value, self.value_columns(columns)), (self.key, self.key_fields)):
            if format == "raw" and len(names) != 1:
                raise PlanError(
                    f"{where}: the 'raw' format holds exactly one column, here {list(names)}; use 'json' or 'csv'"
                )

    def value_columns(self, columns: tuple[str, ...]) -> tuple[str, ...]:
        if self.value_fields_include == "EXCEPT_KEY":
            return tuple(name for name in columns if name not in self.key_fields)
        return columns


@dataclass(frozen=True)
class Client:
    """Where the brokers are and the client properties (``properties.*`` without the prefix)."""

    bootstrap_servers: str
    properties: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not str(self.bootstrap_servers).strip():
            raise PlanError("Kafka needs 'properties.bootstrap.servers' (host:port[,host:port...])")

    @staticmethod
    def of(bootstrap_servers: str, properties: dict[str, str] | None, timeout_s: float) -> Client:
        """From the Python API's arguments: the brokers apart, every property a string."""
        extra = dict(properties or {})
        if "bootstrap.servers" in extra:
            raise PlanError("give the brokers as bootstrap_servers=..., not in properties")
        return Client(bootstrap_servers, {key: str(value) for key, value in extra.items()}, timeout_s)

    def config(self, **extra: str | int | bool) -> dict[str, str | int | bool]:
        """librdkafka's configuration: the properties, the servers, ``extra`` last."""
        return {**self.properties, "bootstrap.servers": self.bootstrap_servers, "log_level": 0, **extra}


@dataclass(frozen=True)
class Startup:
    """Where a new checkpoint starts reading (``scan.startup.mode``); a restart resumes from the
    checkpoint's offsets whatever this says."""

    mode: str = "group-offsets"
    timestamp_ms: int | None = None
    specific_offsets: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", choice(self.mode, STARTUP_MODES, "'scan.startup.mode'"))
        if self.mode == "timestamp" and self.timestamp_ms is None:
            raise PlanError("'scan.startup.mode' = 'timestamp' needs 'scan.startup.timestamp-millis'")
        if self.mode == "specific-offsets" and not self.specific_offsets:
            raise PlanError(
                "'scan.startup.mode' = 'specific-offsets' needs 'scan.startup.specific-offsets', e.g. "
                "'partition:0,offset:42;partition:1,offset:300'"
            )


def specific_offsets(text: str) -> dict[int, int]:
    """Flink's ``partition:0,offset:42;partition:1,offset:300``."""
    offsets = {}
    for part in filter(None, (piece.strip() for piece in text.split(";"))):
        matched = _SPECIFIC.match(part)
        if not matched:
            raise PlanError(
                f"'scan.startup.specific-offsets' part {part!r} is invalid; write 'partition:0,offset:42;partition:1,"
                "offset:300'"
            )
        offsets[int(matched.group(1))] = int(matched.group(2))
    return offsets


def split_list(text: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """Flink's ``a;b`` lists (``topic``, ``key.fields``); a Python sequence as it is."""
    if text is None:
        return ()
    if isinstance(text, str):
        return tuple(part.strip() for part in text.split(";") if part.strip())
    return tuple(text)
