"""What the plan and the runtime need of a connector: the contracts sources and sinks implement.

The plan and the runtime call connectors only through these protocols, and connectors never
import the runtime: a new connector is a class with these methods, nothing else to register.
A capability (a changelog, splits partitioned by key, columns known before Spark starts) is
a protocol of its own, checked with ``isinstance``. This module is a base module: it loads
no Spark, so the pure plan may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from keyflow.connectors.partition_commit import PartitionCommit

Moves = list[list[str]]
"""Staged output of one micro-batch: ``[staged path, final path]`` pairs, recorded in the
checkpoint's manifest and made visible by :meth:`StreamingSink.publish`."""


@runtime_checkable
class Source(Protocol):
    """A bounded source: the rows there now."""

    def describe(self) -> dict[str, Any]:
        """What the plan shows (JSON-serialisable); ``connector`` names the kind."""
        ...

    def read(self, spark: SparkSession, parallelism: int) -> DataFrame:
        """The rows in exactly ``parallelism`` partitions: partition i is subtask i."""
        ...


@runtime_checkable
class StreamingSource(Source, Protocol):
    """A source that may be unbounded (``unbounded`` is True): read as a Spark stream."""

    @property
    def unbounded(self) -> bool: ...

    def read_stream(self, spark: SparkSession, parallelism: int) -> DataFrame:
        """A streaming DataFrame; Spark keeps its offsets in the checkpoint's ``source/``."""
        ...


@runtime_checkable
class Sink(Protocol):
    """Where a batch run writes."""

    def describe(self) -> dict[str, Any]: ...

    def write(self, frame: DataFrame) -> int | None:
        """Write every row of ``frame``; the rows written (None where a sink cannot count)."""
        ...


@runtime_checkable
class StreamingSink(Sink, Protocol):
    """Where a streaming run writes, exactly once: stage, then publish after the commit."""

    def stage(self, frame: DataFrame, batch: int) -> tuple[int, Moves]:
        """Write micro-batch ``batch`` where readers do not see it yet (a replay overwrites
        it); the rows written and the moves that publish it. Computes ``frame`` in full."""
        ...

    def publish(self, moves: Moves) -> None:
        """Make staged output visible; idempotent (a restart repeats it)."""
        ...

    def reset(self) -> None:
        """A new checkpoint starts: remove output of earlier runs."""
        ...

    def discard_after(self, batch: int) -> None:
        """Remove published output of batches after ``batch`` (the checkpoint does not have them)."""
        ...


@runtime_checkable
class AppendOnlySink(Protocol):
    """A sink that may take inserts only (``append_only`` True): a changelog input is a plan
    error. Its ``primary_key``, where it has one, is the key its upserts are written by."""

    @property
    def append_only(self) -> bool: ...

    @property
    def primary_key(self) -> tuple[str, ...]: ...


@runtime_checkable
class CommitsPartitions(Protocol):
    """A streaming sink writing partition directories that it marks complete when its
    ``partition_commit`` (None: no commit policy) says so; the runtime keeps the pending ones
    in the checkpoint and asks after each micro-batch."""

    @property
    def partition_commit(self) -> PartitionCommit | None: ...

    def partitions(self, moves: Moves) -> list[str]: ...

    def commit_partitions(self, partitions: list[str]) -> None: ...

    def withdraw_commits(self, pending: list[str]) -> None: ...


@runtime_checkable
class StagesInCheckpoint(Protocol):
    """A streaming sink that stages micro-batches in the checkpoint (it has no directory of its
    own, e.g. Kafka): the runtime gives it one before a run."""

    def stage_in(self, directory: str) -> None: ...


@runtime_checkable
class KnowsColumns(Protocol):
    """A source whose columns are known when the pipeline is built (checked before Spark)."""

    def column_names(self) -> tuple[str, ...] | None: ...


@runtime_checkable
class KnowsTypes(KnowsColumns, Protocol):
    """A source that also knows its columns' types when the pipeline is built: each column's
    :data:`keyflow.schemas.Type` (None where it cannot tell), so aggregates are checked too."""

    def column_types(self) -> dict[str, str | None]: ...


@runtime_checkable
class DeclaresTypes(Protocol):
    """A source with some of its columns' types declared (files with a schema), though Spark
    may find more columns (partition directories)."""

    def declared_types(self) -> dict[str, str | None]: ...


@runtime_checkable
class ChangelogSource(Protocol):
    """A source whose rows may be changes: ``changelog_mode`` is ``insert`` (rows are
    inserts), ``upsert`` (a row replaces its primary key's; its other columns all null
    delete it) or ``all`` (rows carry ``op``)."""

    @property
    def changelog_mode(self) -> str: ...

    @property
    def primary_key(self) -> tuple[str, ...]: ...


SPLIT_COLUMN = "__keyflow_split"
MALFORMED_COLUMN = "__keyflow_malformed"
"""A source's hidden column: null, or a struct describing a malformed record (its row's other
columns are null); the runtime sends those rows to the source's dead-letter sink."""


@runtime_checkable
class HasDeadLetters(Protocol):
    """A source that sends records it cannot decode to a sink (``dead_letters``; None: it fails
    or skips them) as rows of ``MALFORMED_COLUMN``'s fields."""

    @property
    def dead_letters(self) -> Sink | None: ...


@runtime_checkable
class SplitSource(Protocol):
    """A stream of splits partitioned by key: readable as a pre-keyed stream
    (``reinterpret_as_keyed``), each subtask reading the splits of its key groups."""

    def current_splits(self) -> int:
        """The number of splits now (splits may be added while a pipeline runs)."""
        ...

    def read_stream(
        self, spark: SparkSession, parallelism: int, layout: str | None = None, split_column: bool = False
    ) -> DataFrame:
        """With ``layout``: read pre-keyed, rows carrying their split's key group; with
        ``split_column``, each row's split in ``SPLIT_COLUMN`` (per-split watermarks)."""
        ...


@runtime_checkable
class MarksDeletes(Protocol):
    """An upsert changelog source that tells a delete itself (a Kafka tombstone: a record
    without a value) in a ``keyflow.changelog.DELETED`` column, instead of by its non-key
    columns being all null."""

    @property
    def marks_deletes(self) -> bool: ...


def changelog_mode(source: object) -> str:
    """``insert`` for a source that is no changelog."""
    return source.changelog_mode if isinstance(source, ChangelogSource) else "insert"


def is_unbounded(source: object) -> bool:
    return isinstance(source, StreamingSource) and source.unbounded
