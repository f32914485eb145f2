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


def _stages(spark: SparkSession) -> dict[tuple[int, int], int]:
    """(stage, attempt) → shuffle bytes written, once Spark's listeners have seen every event."""
    context = spark.sparkContext
    if not context.uiWebUrl:
        raise RuntimeError("shuffle metrics need the Spark UI; do not set spark.ui.enabled=false")
    context._jsc.sc().listenerBus().waitUntilEmpty()  # the status store is updated by a listener
    with urlopen(f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/stages", timeout=30) as reply:
        stages = json.load(reply)
    return {(int(s["stageId"]), int(s["attemptId"])): int(s.get("shuffleWriteBytes", 0)) for s in stages}
