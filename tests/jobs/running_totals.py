"""A streaming job for crash tests, run by ``keyflow run`` in a subprocess.

It reads the timestamped log under $KEYFLOW_TEST_DIR and writes per-event running totals,
and with event time (a watermark per split): session windows and
inactivity alerts from timers (see ``tests.event_time``); with a second log of visits
there, also the full outer join of both (a second source in the same query). With
$KEYFLOW_TEST_KAFKA (a broker's address) the visits come from Kafka topic ``crash_visits`` and
the running totals also go to topic ``crash_totals``, exactly once (Kafka transactions).
"""

import os
from pathlib import Path

from keyflow import Pipeline, WatermarkStrategy, kafka, kafka_sink, log, parquet
from tests.event_time import event_time_sinks
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, running_total

base = os.environ["KEYFLOW_TEST_DIR"]
pipeline = Pipeline(
    config={"spark.master": "local[2]", "pipeline.progress": "off", "execution.checkpointing.interval": "0 s"}
)
stream = pipeline.source(
    log(f"{base}/log", rows_per_batch=700), watermark=WatermarkStrategy.for_bounded_out_of_orderness("ts", "30 s")
)
servers = os.environ.get("KEYFLOW_TEST_KAFKA")
totals = stream.key_by("user").process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq")
totals.sink(parquet(f"{base}/out"))
if servers:
    exactly_once = {"delivery_guarantee": "exactly-once", "transactional_id_prefix": "crash"}
    totals.sink(kafka_sink("crash_totals", bootstrap_servers=servers, **exactly_once))
event_time_sinks(stream, Path(base) / "event_time", tumbling_windows=False)  # tumbling: tests/test_event_time.py
if servers or Path(f"{base}/visits").exists():
    visits_schema = "uid STRING, visit BIGINT"
    source = (
        kafka("crash_visits", bootstrap_servers=servers, schema=visits_schema, startup_mode="earliest-offset",
              rows_per_batch=300)
        if servers
        else log(f"{base}/visits", rows_per_batch=300)
    )  # fmt: skip
    visits = pipeline.source(source, uid="visits")
    stream.join(visits, on=[("user", "uid")], how="full").uid("join").sink(parquet(f"{base}/joined"), uid="joined")
