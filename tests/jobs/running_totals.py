"""A streaming job for crash tests, run by ``keyflow run`` in a subprocess.

It reads the log under $KEYFLOW_TEST_DIR and writes per-event running totals.
"""

import os

from keyflow import Pipeline, log, parquet
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, running_total

base = os.environ["KEYFLOW_TEST_DIR"]
pipeline = Pipeline(
    config={"spark.master": "local[2]", "pipeline.progress": "off", "execution.checkpointing.interval": "0 s"}
)
stream = pipeline.source(log(f"{base}/log", rows_per_batch=700))
stream.key_by("user").process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(
    parquet(f"{base}/out")
)
