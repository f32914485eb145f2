"""Spark's own task metrics, read from its status REST API (the UI's ``/api/v1``)."""

from __future__ import annotations

import json
from urllib.request import urlopen

from pyspark.sql import SparkSession


def shuffle_write_bytes(spark: SparkSession) -> int:
    """Bytes every stage of this application has written to Spark's shuffle so far; the
    difference over a run is what that run shuffled. Needs the Spark UI (on by default)."""
    context = spark.sparkContext
    if not context.uiWebUrl:
        raise RuntimeError("shuffle metrics need the Spark UI; do not set spark.ui.enabled=false")
    with urlopen(f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/stages", timeout=30) as reply:
        stages = json.load(reply)
    return sum(int(stage.get("shuffleWriteBytes", 0)) for stage in stages)
