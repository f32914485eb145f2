"""Kafka → keyed running aggregate → Kafka: keyflow against Spark Structured Streaming with its Kafka connector.

One local Kafka broker (``LocalBroker``), one topic ``in`` of ``--partitions`` partitions with
``--batches`` times ``--rows-per-batch`` JSON records ``{"user", "amount", "sent"}``, users uniform
over ``--keys``. Both systems, in one process at parallelism 2, read it from the earliest
offset, ``--rows-per-batch`` records per micro-batch, and keep per user ``count(*)``,
``sum(amount)`` and ``max(sent)``, writing each changed user's row to an output topic keyed by
the user (JSON key and value):

- keyflow: ``kafka(...)`` → ``key_by("user").aggregate(...)`` → ``upsert_kafka_sink(...)`` with
  ``sink.delivery-guarantee`` at-least-once, and again exactly-once (Kafka transactions; the
  cost of exactly-once is the second figure);
- Spark: ``readStream.format("kafka")`` (``maxOffsetsPerTrigger``), ``from_json``,
  ``groupBy("user").agg(...)`` in update mode, ``to_json`` → ``writeStream.format("kafka")``,
  HDFS-backed state store (Spark's default). Spark's Kafka sink is at-least-once (it has no
  transactions). Its connector is spark-sql-kafka-0-10 4.2.0 (``jvm/spark-kafka/pom.xml``: none
  is published for Spark 4.3.0).

Throughput: input records per second over the steady micro-batches (all but the first), each
timed by Spark's ``triggerExecution`` for both (``bench.triggers``). Latency: the queries run
continuously while records are produced at ``--rate`` per second for ``--seconds``; for every
output record, its Kafka timestamp (set when the sink produced it) minus ``max(sent)`` (when
the newest input record of that user in the micro-batch was produced): p50 and p99.

Before the figures both queries run on a small input and their output topics' compacted view is
checked against pandas (the bench stops if either differs). Targets (issue 28): >= 1.0x Spark's
throughput at 10k keys, >= 2.5x at 1M keys.

Run ``.venv/bin/python -m bench.kafka [--keys N] [--runs 3] [--rows-per-batch N] [--batches N]``
(after ``scripts/fetch-jvm.sh``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.report import emit, progress
from bench.triggers import Triggers
from keyflow import Pipeline, kafka, upsert_kafka_sink
from keyflow.runtime.kafka_broker import LocalBroker, kafka_jars
from keyflow.runtime.session import spark_session

BENCH = "kafka"
SCHEMA = "user STRING, amount BIGINT, sent BIGINT"
TRIGGERS = Triggers()


def produce(servers: str, topic: str, rows: int, keys: int, seed: int, rate: float | None = None) -> None:
    """``rows`` JSON records, users uniform over ``keys``; ``sent`` is the produce time (ms);
    ``rate``: at most that many records per second."""
    rng = np.random.default_rng(seed)
    users, amounts = rng.integers(0, keys, rows), rng.integers(0, 100, rows)
    producer = Producer({"bootstrap.servers": servers, "log_level": 0, "linger.ms": 5})
    started = time.monotonic()
    for n in range(rows):
        if rate is not None and n % 100 == 0:
            time.sleep(max(0.0, started + n / rate - time.monotonic()))
        value = b'{"user":"u%d","amount":%d,"sent":%d}' % (users[n], amounts[n], time.time_ns() // 1_000_000)
        while True:
            try:
                producer.produce(topic, value, b'{"user":"u%d"}' % users[n])
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def read_output(servers: str, topic: str, partitions: int) -> list[tuple[bytes, bytes, int]]:
    """Every record of ``topic`` (committed ones): key, value and Kafka timestamp (ms)."""
    consumer = Consumer(
        {"bootstrap.servers": servers, "group.id": "bench", "log_level": 0, "enable.partition.eof": True,
         "isolation.level": "read_committed", "enable.auto.commit": False}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records, ended = [], 0
    while ended < partitions:
        messages = consumer.consume(10_000, 30)
        assert messages, f"no end of {topic} within 30 s"
        for message in messages:
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF
                ended += 1
            else:
                records.append((message.key(), message.value(), message.timestamp()[1]))
    consumer.close()
    return records


def keyflow_query(
    args: argparse.Namespace, servers: str, topic: str, guarantee: str, source_topic: str = "in"
) -> Pipeline:
    pipeline = Pipeline(
        parallelism=args.parallelism,
        config={"spark.master": f"local[{args.parallelism}]", "pipeline.progress": "off",
                "execution.checkpointing.interval": "0 s"},
    )  # fmt: skip
    source = kafka(source_topic, bootstrap_servers=servers, schema=SCHEMA, startup_mode="earliest-offset",
                   rows_per_batch=args.rows_per_batch)  # fmt: skip
    totals = pipeline.source(source).key_by("user").aggregate(events="count(*)", amount="sum(amount)", sent="max(sent)")
    totals.sink(upsert_kafka_sink(topic, bootstrap_servers=servers, primary_key="user", delivery_guarantee=guarantee,
                                  transactional_id_prefix=f"bench-{topic}"))  # fmt: skip
    return pipeline


def spark_query(
    spark: SparkSession, args: argparse.Namespace, servers: str, topic: str, work: Path, source_topic: str = "in"
) -> Any:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", source_topic)
        .option("startingOffsets", "earliest")
    )
    if args.rows_per_batch:
        reader = reader.option("maxOffsetsPerTrigger", args.rows_per_batch)
    records = reader.load()
    rows = records.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("r")).select("r.*")
    totals = rows.groupBy("user").agg(
        F.count(F.lit(1)).alias("events"), F.sum("amount").alias("amount"), F.max("sent").alias("sent")
    )
    out = totals.select(
        F.to_json(F.struct("user")).alias("key"), F.to_json(F.struct("user", "events", "amount", "sent")).alias("value")
    )
    return (
        out.writeStream.outputMode("update")
        .format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", topic)
        .option("checkpointLocation", str(work))
    )


def session(args: argparse.Namespace) -> SparkSession:
    jars = sorted((kafka_jars().parent / "spark-kafka").glob("*.jar"))
    if not jars:
        raise SystemExit("no Spark Kafka connector jars in .jvm/spark-kafka: run scripts/fetch-jvm.sh")
    spark = spark_session(
        {"spark.master": f"local[{args.parallelism}]", "spark.driver.memory": args.driver_memory,
         "spark.jars": ",".join(map(str, jars))},
        app_name="bench",
    )  # fmt: skip
    TRIGGERS.attach(spark)
    spark.conf.set("spark.sql.shuffle.partitions", str(args.parallelism))
    return spark


def run_keyflow(args: argparse.Namespace, servers: str, topic: str, guarantee: str, work: Path) -> list[Any]:
    started = len(TRIGGERS.queries)
    result = keyflow_query(args, servers, topic, guarantee).run(checkpoint=str(work), available_now=True)
    return TRIGGERS.of(TRIGGERS.queries[started], at_least=len(result.batches))


def run_spark(spark: SparkSession, args: argparse.Namespace, servers: str, topic: str, work: Path) -> list[Any]:
    started = len(TRIGGERS.queries)
    query = spark_query(spark, args, servers, topic, work).trigger(availableNow=True).start()
    query.awaitTermination()
    count = max(p["batchId"] for p in query.recentProgress) + 1
    return TRIGGERS.of(TRIGGERS.queries[started], at_least=count)


def current(records: list[tuple[bytes, bytes, int]]) -> dict[str, tuple[int, int]]:
    """The compacted view: the newest (events, amount) per user."""
    view = {}
    for _, value, _ in records:
        row = json.loads(value)
        view[row["user"]] = (row["events"], row["amount"])
    return view


def check(broker: LocalBroker, spark: SparkSession, args: argparse.Namespace, work: Path) -> None:
    """Both queries' output topics hold pandas' per-user totals on a small input."""
    servers = broker.bootstrap_servers
    small = argparse.Namespace(**{**vars(args), "rows_per_batch": 1_000})
    broker.create_topic("in", args.partitions)
    produce(servers, "in", 3_000, 200, seed=1)
    rng = np.random.default_rng(1)
    want = pd.DataFrame({"user": [f"u{n}" for n in rng.integers(0, 200, 3_000)], "amount": rng.integers(0, 100, 3_000)})
    expected = {u: (int(r.events), int(r.amount)) for u, r in
                want.groupby("user").agg(events=("amount", "size"), amount=("amount", "sum")).iterrows()}  # fmt: skip
    for name in ("check-keyflow", "check-spark"):
        broker.create_topic(name, args.partitions)
    run_keyflow(small, servers, "check-keyflow", "exactly-once", work / "check-kf")
    run_spark(spark, small, servers, "check-spark", work / "check-ss")
    for name in ("check-keyflow", "check-spark"):
        got = current(read_output(servers, name, args.partitions))
        assert got == expected, f"{name}: {len(got)} users, {sum(a != expected.get(u) for u, a in got.items())} wrong"
    progress(f"  check: both output topics equal pandas ({len(expected)} users)")


def latency(
    broker: LocalBroker, spark: SparkSession, args: argparse.Namespace, work: Path
) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of each system while records arrive at ``--rate`` per second."""
    servers, found = broker.bootstrap_servers, {}
    for name in ("keyflow", "spark"):
        topic_in, topic_out = f"live-in-{name}", f"live-out-{name}"
        broker.create_topic(topic_in, args.partitions)
        broker.create_topic(topic_out, args.partitions)
        live = argparse.Namespace(**{**vars(args), "rows_per_batch": None})
        if name == "keyflow":
            job = keyflow_query(live, servers, topic_out, "at-least-once", topic_in).start(str(work / "live-kf"))
            stop = job.stop
        else:
            writer = spark_query(spark, live, servers, topic_out, work / "live-ss", topic_in)
            query = writer.trigger(processingTime="0 seconds").start()
            stop = query.stop
        time.sleep(3)
        feeder = threading.Thread(target=produce, args=(servers, topic_in, int(args.rate * args.seconds),
                                                          args.keys, 9, args.rate))  # fmt: skip
        feeder.start()
        feeder.join()
        time.sleep(5)
        stop()
        lags = [
            stamp - json.loads(value)["sent"] for _, value, stamp in read_output(servers, topic_out, args.partitions)
        ]
        found[name] = (float(np.percentile(lags, 50)), float(np.percentile(lags, 99)))
        progress(f"  latency {name}: p50 {found[name][0]:.0f} ms, p99 {found[name][1]:.0f} ms ({len(lags)} records)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows-per-batch", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--rate", type=float, default=2_000)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--driver-memory", default="4g")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    try:
        with LocalBroker(work / "broker", heap="1g") as broker:
            spark = session(args)
            check(broker, spark, args, work)
            servers = broker.bootstrap_servers
            broker.delete_topic("in")
            broker.create_topic("in", args.partitions)
            produce(servers, "in", args.rows_per_batch * args.batches, args.keys, seed=2)
            rates: dict[str, list[float]] = {"keyflow": [], "keyflow-exactly-once": [], "spark": []}
            rows = args.rows_per_batch * (args.batches - 1)
            for run in range(args.runs):
                for name in rates:
                    topic = f"out-{name}-{run}"
                    broker.create_topic(topic, args.partitions)
                    target = work / f"{name}-{run}"
                    if name == "spark":
                        times = run_spark(spark, args, servers, topic, target)
                    else:
                        guarantee = "exactly-once" if name.endswith("exactly-once") else "at-least-once"
                        times = run_keyflow(args, servers, topic, guarantee, target)
                    rates[name].append(rows / sum(t[1] for t in times[1:]))
                    progress(f"  run {run} {name}: {rates[name][-1]:,.0f} records/s, batches "
                             f"{[round(t[1], 2) for t in times]}")  # fmt: skip
                    broker.delete_topic(topic)
                    shutil.rmtree(target, ignore_errors=True)
            metric = f"Kafka -> running count/sum/max per key -> Kafka, {args.keys:,} keys, input records/s"
            spark_label = "Spark SS Kafka source + update-mode aggregate + Kafka sink (at-least-once, hdfs state)"
            for label, values, peer, peer_values in (
                ("", rates["keyflow"], spark_label, rates["spark"]),
                (", exactly-once sink", rates["keyflow-exactly-once"], "keyflow at-least-once sink", rates["keyflow"]),
            ):
                emit(BENCH, f"{metric}{label} (best of {args.runs})", "records/s", max(values), peer, max(peer_values))
                emit(BENCH, f"{metric}{label} (median of {args.runs})", "records/s", statistics.median(values), peer,
                     statistics.median(peer_values))  # fmt: skip
            lags = latency(broker, spark, args, work)
            for index, label in enumerate(("p50", "p99")):
                emit(BENCH, f"end-to-end latency {label} at {args.rate:,.0f} records/s, {args.keys:,} keys", "ms",
                     lags["keyflow"][index], spark_label, lags["spark"][index])  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
