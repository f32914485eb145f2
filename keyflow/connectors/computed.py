"""Computed columns of a table (Flink's ``name AS expression`` in ``CREATE TABLE``).

They are added where the source is read, as in Flink's table scan, so that a watermark can
be declared on one (Nexmark's ``dateTime``) and every reader of the source sees them. The
wrapped source keeps every capability it has (splits, changelogs, dead letters): whatever
this class does not define is the wrapped source's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from keyflow.connectors.base import KnowsColumns, KnowsTypes, Source


class ComputedColumns:
    """``source``'s rows with ``columns`` (name, Spark SQL expression) appended, in order."""

    def __init__(self, source: Source, columns: Sequence[tuple[str, str]]) -> None:
        self.source, self.columns = source, tuple(columns)

    def describe(self) -> dict[str, Any]:
        return {**self.source.describe(), "computed": dict(self.columns)}

    def column_names(self) -> tuple[str, ...] | None:
        names = self.source.column_names() if isinstance(self.source, KnowsColumns) else None
        return None if names is None else (*names, *(name for name, _ in self.columns))

    def read(self, spark: SparkSession, parallelism: int) -> DataFrame:
        return self._computed(self.source.read(spark, parallelism))

    def read_stream(self, spark: SparkSession, parallelism: int, **extra: Any) -> DataFrame:
        return self._computed(self.source.read_stream(spark, parallelism, **extra))  # type: ignore[attr-defined]

    def _computed(self, frame: DataFrame) -> DataFrame:
        quoted = ["`" + name.replace("`", "``") + "`" for name, _ in self.columns]
        return frame.selectExpr("*", *(f"{sql} AS {name}" for name, (_, sql) in zip(quoted, self.columns, strict=True)))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "source":  # unpickling looks these up before __init__
            raise AttributeError(name)
        if name == "column_types" and isinstance(self.source, KnowsTypes):
            inner = self.source
            return lambda: {**inner.column_types(), **{column: None for column, _ in self.columns}}
        return getattr(self.source, name)
