"""What the runtime needs of a connector: the contracts every source and sink implements.

The runtime calls connectors only through these methods, and connectors never import the
runtime: a new connector is a class with these methods, nothing else to register.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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
