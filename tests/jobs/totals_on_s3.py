"""Running totals of the log under $KEYFLOW_TEST_DIR, run by ``keyflow run`` with its checkpoint
on S3: the store is reached through the AWS SDK's environment (no s3.* options here)."""

import os

from keyflow import Pipeline, log, parquet
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, config, running_total

base = os.environ["KEYFLOW_TEST_DIR"]
pipeline = Pipeline(config={**config(2), "pipeline.progress": "off"})
stream = pipeline.source(log(f"{base}/log", rows_per_batch=700))
stream.key_by("user").process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(
    parquet(f"{base}/out")
)
