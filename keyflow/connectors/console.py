"""Console and blackhole sinks: look at a few rows, or discard them all."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from rich.console import Console
from rich.table import Table

from keyflow.changelog import OP
from keyflow.connectors.base import Moves


class _Unpublished:
    """A streaming sink with no files to publish: nothing to empty or roll back on restart."""

    def publish(self, moves: Moves) -> None:
        return None

    def reset(self) -> None:
        return None

    def discard_after(self, batch: int) -> None:
        return None


class ConsoleSink(_Unpublished):
    def __init__(self, rows: int = 20, title: str | None = None) -> None:
        self.rows, self.title = rows, title

    def describe(self) -> dict[str, Any]:
        return {"connector": "console", "rows": self.rows}

    def write(self, frame: DataFrame, title: str | None = None) -> int:
        shown = frame.limit(self.rows).toArrow()
        table = Table(*shown.column_names, title=title or self.title)
        for row in shown.to_pylist():
            table.add_row(*[str(value) for value in row.values()])
        Console().print(table)
        return shown.num_rows

    def stage(self, frame: DataFrame, batch: int) -> tuple[int, Moves]:
        """Print the micro-batch's first rows (a console cannot take output back). The whole
        batch is computed, as every streaming sink must: keyed operators write state at the end."""
        cached = frame.persist()
        try:
            rows = cached.count()
            self.write(cached, f"{self.title or 'batch'} {batch}: {rows:,} rows")
        finally:
            cached.unpersist()
        return rows, []


def console(rows: int = 20, title: str | None = None) -> ConsoleSink:
    """Print the first ``rows`` rows."""
    return ConsoleSink(rows, title)


class BlackholeSink(_Unpublished):
    """Runs the pipeline and discards the rows (Flink's ``blackhole``): for benchmarks."""

    def describe(self) -> dict[str, Any]:
        return {"connector": "blackhole"}

    def write(self, frame: DataFrame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def stage(self, frame: DataFrame, batch: int) -> tuple[int, Moves]:
        from keyflow.connectors.files import counted_write

        return counted_write(frame, lambda observed: observed.write.format("noop").mode("overwrite").save()), []


def blackhole() -> BlackholeSink:
    """Discard every row; the work upstream still runs in full."""
    return BlackholeSink()


class PrintSink(_Unpublished):
    """Every row on standard output in Flink's print format: ``identifier> +I[v1, v2]``, the
    row kind taken from a changelog's ``op`` column (``+I`` for an insert-only stream)."""

    def __init__(self, identifier: str | None = None) -> None:
        self.identifier = identifier

    def describe(self) -> dict[str, Any]:
        return {"connector": "print", **({"print-identifier": self.identifier} if self.identifier else {})}

    def write(self, frame: DataFrame) -> int:
        """Flink's format: ``identifier:task> `` (task from 1) when more than one task prints."""
        from pyspark.sql import functions as F

        tasks = frame.rdd.getNumPartitions()
        rows = frame.withColumn("__task", F.spark_partition_id() + F.lit(1)).toArrow()
        kinds = rows.column(OP).to_pylist() if OP in rows.column_names else ["+I"] * rows.num_rows
        values = rows.drop_columns([name for name in (OP, "__task") if name in rows.column_names])
        lines = [
            f"{self._prefix(task, tasks)}{kind}[{', '.join(_text(v) for v in row.values())}]"
            for kind, task, row in zip(kinds, rows.column("__task").to_pylist(), values.to_pylist(), strict=True)
        ]
        if lines:
            print("\n".join(lines), flush=True)
        return rows.num_rows

    def _prefix(self, task: int, tasks: int) -> str:
        name = self.identifier or ""
        if tasks > 1:
            name = f"{name}:{task}" if name else str(task)
        return f"{name}> " if name else ""

    def stage(self, frame: DataFrame, batch: int) -> tuple[int, Moves]:
        """Print the micro-batch (standard output cannot take it back: at least once)."""
        return self.write(frame), []


def _text(value: Any) -> str:
    return "null" if value is None else str(value)  # as Flink's Row.toString


def print_rows(identifier: str | None = None) -> PrintSink:
    """Print every row with its row kind, like Flink's ``print`` connector."""
    return PrintSink(identifier)
