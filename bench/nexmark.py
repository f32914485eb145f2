"""Nexmark: the published queries (bench/nexmark_sql) in events per second per core.

keyflow runs each query as a script: Nexmark's own source DDL (``'connector' = 'nexmark'``,
``--events`` events at Flink's benchmark rate of 10M events per second of event time,
Nexmark's proportions) and the query with its sink adapted to ``blackhole``; a bounded
source runs as one batch job, at parallelism 2 on ``local[2]``. Events per second per core
= events / (wall seconds x 2 cores).

Peers, in the same process on the same cores:

- **Spark SQL** (plain PySpark, batch): the same generated events (keyflow's generator, a
  Spark DataFrame) as temporary views ``datagen``/``person``/``auction``/``bid``, the query's
  ``SELECT`` text run by ``spark.sql`` into the ``noop`` sink, with Spark's meanings. Only
  where Spark SQL parses the query as published: window table functions, SPLIT_INDEX, legacy
  group windows and FOR SYSTEM_TIME AS OF are Flink's, so q5, q7, q8, q11, q13 and q22 have
  no Spark figure.
- **Spark Structured Streaming** (``--streaming``): both sides as streams of the same
  events in four micro-batches, run to the end (``availableNow``), keyflow's with a
  checkpoint; Spark's the ``SELECT`` over the same generator as a streaming source into
  ``noop``. Only where Structured Streaming runs the query: not Top-N (``ROW_NUMBER``),
  ``COUNT(DISTINCT)``, an aggregate of an aggregate (q4), window table functions, PROCTIME,
  SPLIT_INDEX, a Python UDF; so q0 to q3, q10, q17, q20, q21.
- **Flink** (published): the "Throughput/Cores" column of Nexmark's result table,
  ``GUIDE_V1.md`` of github.com/nexmark/nexmark at commit 6b3646c (100M events at 10M/s,
  8 TaskManagers of one slot, RocksDB, exactly-once checkpoints every 3 minutes; Flink
  1.13 to 2.0). Another machine and a streaming job with checkpoints: an outside yardstick,
  not a same-machine comparison.

Run ``.venv/bin/python -m bench.nexmark [--events 500000] [--runs 3] [--queries q0,q5] [--streaming]``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench import nexmark_sql
from bench.report import alternating_seconds, emit, progress
from keyflow import Pipeline
from keyflow.connectors.nexmark import NexmarkConfig, NexmarkSource
from keyflow.runtime.session import spark_session

BENCH = "nexmark"
RATE, CORES = 10_000_000, 2
UNIT = "events/s/core"
# Nexmark GUIDE_V1.md (commit 6b3646c), Throughput/Cores in K events/s.
FLINK_PER_CORE = {
    "q0": 155.02, "q1": 157.94, "q2": 175.21, "q3": 152.12, "q4": 34.33, "q5": 22.14, "q7": 12.33, "q8": 146.14,
    "q9": 14.24, "q10": 57.81, "q11": 39.7, "q12": 75.67, "q13": 130.73, "q14": 161.23, "q15": 72.42,
    "q16": 18.65, "q17": 116.8, "q18": 53.7, "q19": 44.04, "q20": 18.98, "q21": 98.49, "q22": 129.96,
}  # fmt: skip
SPARK_CANNOT = ("q5", "q7", "q8", "q11", "q12", "q13", "q22")  # window table functions, SPLIT_INDEX, FOR SYSTEM_TIME


# Structured Streaming runs these (append, or update for an aggregate); the others it refuses.
STREAMING_MODES = {"q0": "append", "q1": "append", "q2": "append", "q3": "append", "q10": "append",
                   "q17": "update", "q20": "append", "q21": "append"}  # fmt: skip
BATCHES = 4  # micro-batches of a streamed run


def keyflow_run(name: str, events: int) -> None:
    pipeline = Pipeline(parallelism=CORES, config={"pipeline.progress": "off"})
    pipeline.sql(nexmark_sql.source(events, RATE) + nexmark_sql.query(name))
    pipeline.run()


def keyflow_stream(name: str, events: int) -> None:
    """The query as a stream of ``events`` in BATCHES micro-batches, to the end, from a new checkpoint."""
    streamed = f"'connector' = 'nexmark', 'rate.limited' = 'true', 'scan.rows-per-batch' = '{-(-events // BATCHES)}',"
    pipeline = Pipeline(
        parallelism=CORES, config={"pipeline.progress": "off", "execution.checkpointing.interval": "0 s"}
    )
    pipeline.sql(
        nexmark_sql.source(events, RATE).replace("'connector' = 'nexmark',", streamed) + nexmark_sql.query(name)
    )
    with tempfile.TemporaryDirectory() as checkpoint:
        pipeline.run(checkpoint=checkpoint, available_now=True)


def spark_views(spark: SparkSession, events: int, streaming: bool = False) -> None:
    """Nexmark's table and views over the same generated events, for Spark SQL (as a stream
    of BATCHES micro-batches for Structured Streaming)."""
    config = NexmarkConfig(events=events, first_event_rate=RATE, rows_per_batch=-(-events // BATCHES))
    source = NexmarkSource(config)
    frame = source.read_stream(spark, CORES) if streaming else source.read(spark, CORES)
    event_time = F.coalesce(F.col("person.dateTime"), F.col("auction.dateTime"), F.col("bid.dateTime"))
    frame.withColumn("dateTime", event_time).createOrReplaceTempView("datagen")
    views = (nexmark_sql.QUERIES / "ddl_views.sql").read_text().replace("${NEXMARK_TABLE}", "datagen")
    for statement in views.split(";"):
        if "CREATE VIEW" in statement:
            spark.sql(statement.replace("CREATE VIEW", "CREATE OR REPLACE TEMPORARY VIEW"))


def spark_run(spark: SparkSession, name: str) -> None:
    spark.sql(_select(name)).write.format("noop").mode("overwrite").save()


def spark_stream(spark: SparkSession, name: str) -> None:
    with tempfile.TemporaryDirectory() as checkpoint:
        writer = spark.sql(_select(name)).writeStream.format("noop").outputMode(STREAMING_MODES[name])
        writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start().awaitTermination()


def _select(name: str) -> str:
    """The query's ``SELECT`` (after its ``INSERT INTO``)."""
    return re.split(r"INSERT INTO \w+", nexmark_sql.query(name), maxsplit=1)[1].strip().rstrip(";")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--queries", default=",".join(nexmark_sql.RUNNABLE))
    parser.add_argument("--streaming", action="store_true", help="keyflow and Structured Streaming as streams")
    args = parser.parse_args()
    spark = spark_session({"spark.master": f"local[{CORES}]", "spark.sql.shuffle.partitions": str(CORES)})
    spark_views(spark, args.events, streaming=args.streaming)
    nexmark_sql.side_input(Path("/tmp/side_input"))  # where q13's side input is read from (nexmark_sql.query)
    if args.streaming:
        streamed(spark, args)
        return
    for name in args.queries.split(","):
        progress(f"{name}: {args.runs} runs of {args.events} events")
        runs = {"keyflow": lambda name=name: keyflow_run(name, args.events)}
        if name not in SPARK_CANNOT:
            runs["spark"] = lambda name=name: spark_run(spark, name)
        keyflow_run(name, 1_000)  # warm: Python workers, code paths
        seconds = alternating_seconds(runs, args.runs)
        rate = {system: [args.events / (s * CORES) for s in times] for system, times in seconds.items()}
        for label, pick in (("best", max), ("median", statistics.median)):
            metric = f"{name} ({label} of {args.runs})"
            if "spark" in rate:
                emit(BENCH, metric, UNIT, pick(rate["keyflow"]), "Spark SQL batch, same events", pick(rate["spark"]))
            flink = FLINK_PER_CORE[name] * 1000
            emit(BENCH, metric, UNIT, pick(rate["keyflow"]), "Flink (Nexmark GUIDE_V1.md, published)", flink)


def streamed(spark: SparkSession, args: argparse.Namespace) -> None:
    """keyflow's streamed run of each query beside Structured Streaming's, where it runs it."""
    for name in [query for query in args.queries.split(",") if query in STREAMING_MODES]:
        progress(f"{name}: {args.runs} streamed runs of {args.events} events in {BATCHES} micro-batches")
        runs = {"keyflow": lambda name=name: keyflow_stream(name, args.events),
                "spark": lambda name=name: spark_stream(spark, name)}  # fmt: skip
        keyflow_stream(name, 1_000)  # warm: Python workers, code paths
        seconds = alternating_seconds(runs, args.runs)
        rate = {system: [args.events / (s * CORES) for s in times] for system, times in seconds.items()}
        for label, pick in (("best", max), ("median", statistics.median)):
            emit(BENCH, f"{name} streamed ({label} of {args.runs})", UNIT, pick(rate["keyflow"]),
                 "Spark Structured Streaming, same events", pick(rate["spark"]))  # fmt: skip


if __name__ == "__main__":
    main()
