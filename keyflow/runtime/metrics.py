"""Spark's own task metrics, read from its status REST API (the UI's ``/api/v1``)."""

from __future__ import annotations

import json
from urllib.request import urlopen

from pyspark.sql import SparkSession


class ShuffleMeter:
    """Bytes Spark's shuffle writes from now on, counted over the stages that start after it
    (so stages the UI forgets, ``spark.ui.retainedStages``, do not skew the difference)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._before = set(_stages(spark))

    def written(self) -> int:
        """Shuffle bytes written by the stages started since the meter was made."""
        return sum(written for stage, written in _stages(self.spark).items() if stage not in self._before)

    def busiest_reader(self) -> list[tuple[int, float]]:
        """Of the stages started since, the one that read the most shuffle bytes (a keyed
        stage): each task's shuffle bytes read and run time in seconds, by partition."""
        context = self.spark.sparkContext
        new = [stage for stage in _stages(self.spark, read=True).items() if stage[0] not in self._before]
        if not new:
            return []
        (stage, attempt), _ = max(new, key=lambda item: item[1])
        url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/stages/{stage}/{attempt}/taskList"
        with urlopen(f"{url}?length=100000", timeout=30) as reply:
            tasks = json.load(reply)
        loads = {}
        for task in tasks:
            if task.get("status") != "SUCCESS":
                continue
            metrics = task["taskMetrics"]
            read = metrics["shuffleReadMetrics"]
            loads[task["index"]] = (read["localBytesRead"] + read["remoteBytesRead"], metrics["executorRunTime"] / 1000)
        return [loads[index] for index in sorted(loads)]


def _stages(spark: SparkSession, read: bool = False) -> dict[tuple[int, int], int]:
    """(stage, attempt) → shuffle bytes written (``read``: read), once Spark's listeners have
    seen every event."""
    context = spark.sparkContext
    if not context.uiWebUrl:
        raise RuntimeError("shuffle metrics need the Spark UI; do not set spark.ui.enabled=false")
    context._jsc.sc().listenerBus().waitUntilEmpty()  # the status store is updated by a listener
    with urlopen(f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/stages", timeout=30) as reply:
        stages = json.load(reply)
    metric = "shuffleReadBytes" if read else "shuffleWriteBytes"
    return {(int(s["stageId"]), int(s["attemptId"])): int(s.get(metric, 0)) for s in stages}


def rows_read_by_partition(spark: SparkSession, rdd_id: int) -> list[int] | None:
    """Rows each partition of the stage that ran RDD ``rdd_id`` read from its shuffle (the
    first successful attempt of each task), or None if no finished stage ran it."""
    context = spark.sparkContext
    context._jsc.sc().listenerBus().waitUntilEmpty()
    base = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/stages"
    with urlopen(base, timeout=30) as reply:
        stages = [s for s in json.load(reply) if rdd_id in s.get("rddIds", []) and s["status"] == "COMPLETE"]
    if not stages:
        return None
    stage = min(stages, key=lambda s: (s["stageId"], s["attemptId"]))
    with urlopen(f"{base}/{stage['stageId']}/{stage['attemptId']}/taskList?length=100000", timeout=30) as reply:
        tasks = json.load(reply)
    rows: dict[int, int] = {}
    for task in tasks:
        if task.get("status") == "SUCCESS":
            rows.setdefault(task["index"], task["taskMetrics"]["shuffleReadMetrics"]["recordsRead"])
    return [rows.get(index, 0) for index in range(stage["numTasks"])]
