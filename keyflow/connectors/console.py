"""Console and blackhole sinks: look at a few rows, or discard them all."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from rich.console import Console
from rich.table import Table

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
