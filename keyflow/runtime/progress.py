"""A live progress line for running Spark jobs, fed by Spark's status tracker."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

_POLL_SECONDS = 0.25


def progress_enabled(setting: str) -> bool:
    return setting == "on" or (setting == "auto" and sys.stderr.isatty())


@contextmanager
def spark_progress(spark: SparkSession, label: str, enabled: bool) -> Iterator[None]:
    """Show tasks done / total of the active Spark stages while the body runs."""
    if not enabled:
        yield
        return
    tracker = spark.sparkContext.statusTracker()
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(label, total=None)
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(_POLL_SECONDS):
                stages = [info for info in map(tracker.getStageInfo, tracker.getActiveStageIds()) if info]
                total = sum(info.numTasks for info in stages)
                done = sum(info.numCompletedTasks for info in stages)
                names = ", ".join(str(info.stageId) for info in stages)
                description = f"{label} (stage {names})" if names else label
                progress.update(task, total=total or None, completed=done, description=description)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
