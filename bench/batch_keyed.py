"""Batch keyed work: keyflow against plain PySpark on the same generated rows.

1. Keyed count + sum over 20M rows with 10k keys: a keyflow ``aggregate`` against
   ``groupBy().agg()``. Target: keyflow wall time / PySpark <= 1.25.
2. Per-key running state (running spend per user in time order): a keyflow ``process``
   with value state against ``groupBy().applyInPandas()`` computing the same. Target:
   keyflow at least 2x faster (ratio <= 0.5). Also timed with many small keys (2M rows,
   100k keys: 20 rows per key), where applyInPandas pays one pandas call per key.

Both sides build the same datagen rows inside the timed run (as a script would) and end
in Spark's ``noop`` writer, so each run does the whole computation and writes nothing. Run: ``make bench`` or
``.venv/bin/python -m bench.batch_keyed [--rows N] [--keys N] [--parallelism P]``.
"""

from __future__ import annotations

import argparse

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.report import best_seconds, emit, progress
from keyflow import KeyedBatch, KeyedState, Pipeline, ValueState, blackhole, datagen, random_float, random_int, sequence
from keyflow.connectors.datagen import DatagenSource
from keyflow.runtime.session import spark_session

SPEND_SCHEMA = "user long, n long, running double"


def source(rows: int, keys: int) -> DatagenSource:
    return datagen(
        rows=rows, fields={"user": random_int(1, keys), "price": random_float(0, 100), "n": sequence()}, seed=11
    )


def running_spend(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    spend = state["spend"]
    running = batch.running_sum(batch.data.column("price"), initial=spend.get())
    spend.update(pa.array(batch.last_per_key(running)))
    return pa.table({"user": batch.data.column("user"), "n": batch.data.column("n"), "running": running})


def running_spend_pandas(group: pd.DataFrame) -> pd.DataFrame:
    ordered = group.sort_values("n")
    return pd.DataFrame({"user": ordered.user, "n": ordered.n, "running": ordered.price.cumsum()})


def keyflow_pipeline(rows: int, keys: int, parallelism: int, kind: str) -> Pipeline:
    p = Pipeline(parallelism=parallelism, config={"spark.master": f"local[{parallelism}]", "pipeline.progress": "off"})
    keyed = p.source(source(rows, keys)).key_by("user")
    if kind == "aggregate":
        keyed.aggregate(clicks="count(*)", revenue="sum(price)").sink(blackhole())
    else:
        keyed.process(running_spend, schema=SPEND_SCHEMA, state={"spend": ValueState("float64")}, order_by=["n"]).sink(
            blackhole()
        )
    return p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument(
        "--many-keys", type=int, default=100_000, help="also time the running state with this many keys (0: skip)"
    )
    parser.add_argument("--many-keys-rows", type=int, default=2_000_000, help="rows for the many-keys case")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", choices=["aggregate", "process"], help="run one of the two comparisons")
    args = parser.parse_args()
    spark = spark_session({"spark.master": f"local[{args.parallelism}]"}, app_name="keyflow-bench")

    if args.only != "process":
        compare_aggregate(args, spark)
    if args.only != "aggregate":
        compare_process(args, spark)


def noop(result: DataFrame) -> None:
    result.write.format("noop").mode("overwrite").save()


def compare_aggregate(args: argparse.Namespace, spark: SparkSession) -> None:
    progress(f"aggregate: {args.rows:,} rows, {args.keys:,} keys, parallelism {args.parallelism}")
    aggregate = keyflow_pipeline(args.rows, args.keys, args.parallelism, "aggregate")
    keyflow_seconds = best_seconds(aggregate.run, args.repeats)
    peer_seconds = best_seconds(
        lambda: noop(
            source(args.rows, args.keys)
            .read(spark, args.parallelism)
            .groupBy("user")
            .agg(F.count("*").alias("clicks"), F.sum("price").alias("revenue"))
        ),
        args.repeats,
    )
    metric = "keyed_count_sum" if args.rows == 20_000_000 else f"keyed_count_sum_{args.rows}_rows"
    emit("batch_keyed", metric, "s", keyflow_seconds, "pyspark-groupBy-agg", peer_seconds)


def compare_process(args: argparse.Namespace, spark: SparkSession) -> None:

    cases = [(args.rows, args.keys)] + ([(args.many_keys_rows, args.many_keys)] if args.many_keys else [])
    for row_count, keys in cases:
        progress(f"running state: {row_count:,} rows, {keys:,} keys")
        process = keyflow_pipeline(row_count, keys, args.parallelism, "process")
        keyflow_seconds = best_seconds(process.run, args.repeats)
        peer_seconds = best_seconds(
            lambda row_count=row_count, keys=keys: noop(
                source(row_count, keys)
                .read(spark, args.parallelism)
                .groupBy("user")
                .applyInPandas(running_spend_pandas, SPEND_SCHEMA)
            ),
            args.repeats,
        )
        metric = "keyed_running_state" if keys == args.keys else f"keyed_running_state_{row_count}_rows_{keys}_keys"
        emit("batch_keyed", metric, "s", keyflow_seconds, "pyspark-applyInPandas", peer_seconds)


if __name__ == "__main__":
    main()
