"""Running totals on a multi-host standalone cluster ($KEYFLOW_TEST_MASTER), run by ``keyflow run``
on the driver host ($KEYFLOW_TEST_DRIVER_HOST) with its checkpoint on the object store host
(``--checkpoint s3://...``, ``--conf s3.endpoint=...``) and the adaptive scheduler, so the
parallelism follows the worker hosts that come and go (expected answer: pandas)."""

import os
from pathlib import Path

from keyflow import Pipeline, log, parquet
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, running_total

base = os.environ["KEYFLOW_TEST_DIR"]
pipeline = Pipeline(
    config={
        "spark.master": os.environ["KEYFLOW_TEST_MASTER"],
        "spark.driver.host": os.environ["KEYFLOW_TEST_DRIVER_HOST"],
        "spark.driver.bindAddress": os.environ["KEYFLOW_TEST_DRIVER_HOST"],
        "spark.executor.memory": "512m",
        "spark.executorEnv.PYTHONPATH": str(Path(__file__).resolve().parents[2]),  # workers import tests.streams
        "spark.ui.enabled": "false",
        # A host that is cut off or gone is noticed within seconds (Spark's defaults: 120 s).
        "spark.network.timeout": "20s",
        "spark.network.timeoutInterval": "5s",
        "spark.executor.heartbeatInterval": "2s",
        "pipeline.progress": "off",
        "execution.checkpointing.interval": "1 s",
        "jobmanager.scheduler": "adaptive",
        "jobmanager.adaptive-scheduler.scaling-interval.min": "3 s",
        "jobmanager.adaptive-scheduler.resource-stabilization-timeout": "2 s",
        "jobmanager.adaptive-scheduler.resource-wait-timeout": "5 s",
    }
)
stream = pipeline.source(log(f"{base}/log", rows_per_batch=2000))  # keeps up with the appender
stream.key_by("user").process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(
    parquet(f"{base}/out")
)
