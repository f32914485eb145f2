"""An adaptive streaming job on the standalone cluster $KEYFLOW_TEST_MASTER, run by ``keyflow run``.

Per-event running totals of the log under $KEYFLOW_TEST_DIR (expected answer: pandas).
"""

import os
from pathlib import Path

from keyflow import Pipeline, log, parquet
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, running_total

base = os.environ["KEYFLOW_TEST_DIR"]
root = str(Path(__file__).resolve().parents[2])
pipeline = Pipeline(
    config={
        "spark.master": os.environ["KEYFLOW_TEST_MASTER"],
        "spark.driver.host": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.executorEnv.PYTHONPATH": root,  # the executors' Python workers import tests.streams
        "spark.ui.enabled": "false",
        "pipeline.progress": "off",
        "execution.checkpointing.interval": "1 s",
        "jobmanager.scheduler": "adaptive",
        "jobmanager.adaptive-scheduler.scaling-interval.min": "40 s",
        "jobmanager.adaptive-scheduler.resource-stabilization-timeout": "4 s",
        "jobmanager.adaptive-scheduler.resource-wait-timeout": "12 s",
    }
)
stream = pipeline.source(log(f"{base}/log", rows_per_batch=400))
stream.key_by("user").process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(
    parquet(f"{base}/out")
)
