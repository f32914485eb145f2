"""Batch keyed work: keyflow against plain PySpark on the same generated rows.

1. Keyed count + sum over 20M rows with 10k keys: a keyflow ``aggregate`` against
   ``groupBy().agg()``. Target (issue 16): keyflow wall time / PySpark <= 1.1, at 20M and
   100M rows (``--rows``), with auto-parallelism on (the default) and off.
2. Per-key running state (running spend per user in time order): a keyflow ``process``
   with value state and ``order_by`` against ``groupBy().applyInPandas()`` sorting each
   group by the same column. Target: ratio <= 0.5. Also timed with many small keys
   (``--many-keys``: 2M rows, 100k keys, 20 rows per key), where applyInPandas pays one
   pandas call per key.
3. The same running state in arrival order: ``process`` without ``order_by`` (no sort
   anywhere) against ``applyInPandas`` without the sort (Spark still sorts to group).

Both sides build the same datagen rows inside the timed run (as a script would), run in
one session with the same settings, alternate round by round, and end in Spark's ``noop``
writer, so each run does the whole computation and writes nothing. Each figure: best and
median of ``--repeats`` rounds. Run: ``make bench`` or
``.venv/bin/python -m bench.batch_keyed [--rows N] [--keys N] [--parallelism P] [--only ...]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.report import PeakWorkerMemory, alternating_seconds, emit, emit_best_and_median, progress
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


def running_spend_pandas_arrival(group: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"user": group.user, "n": group.n, "running": group.price.cumsum()})


def keyflow_pipeline(rows: int, keys: int, parallelism: int, kind: str, auto: bool = True) -> Pipeline:
    config = {
        "spark.master": f"local[{parallelism}]",
        "pipeline.progress": "off",
        "execution.batch.adaptive.auto-parallelism.enabled": auto,
    }
    p = Pipeline(parallelism=parallelism, config=config)
    keyed = p.source(source(rows, keys)).key_by("user")
    if kind == "aggregate":
        keyed.aggregate(clicks="count(*)", revenue="sum(price)").sink(blackhole())
    else:
        order_by = ["n"] if kind == "process" else []
        state = {"spend": ValueState("float64")}
        keyed.process(running_spend, schema=SPEND_SCHEMA, state=state, order_by=order_by).sink(blackhole())
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["aggregate", "process", "arrival"], help="run one of the comparisons")
    args = parser.parse_args()
    spark = spark_session({"spark.master": f"local[{args.parallelism}]"}, app_name="keyflow-bench")
    warm_up(spark, args.parallelism)
    if args.only in (None, "aggregate"):
        compare_aggregate(args, spark)
    if args.only in (None, "process"):
        compare_process(args, spark, "process", running_spend_pandas)
    if args.only in (None, "arrival"):
        compare_process(args, spark, "arrival", running_spend_pandas_arrival)


def warm_up(spark: SparkSession, parallelism: int) -> None:
    """Each side once on a few rows first, so no timed run pays the JVM's or the workers' start."""
    for kind in ("aggregate", "process", "arrival"):
        keyflow_pipeline(100_000, 1_000, parallelism, kind).run()
    rows = source(100_000, 1_000).read(spark, parallelism).groupBy("user")
    noop(rows.agg(F.count("*")))
    noop(rows.applyInPandas(running_spend_pandas, SPEND_SCHEMA))


def noop(result: DataFrame) -> None:
    result.write.format("noop").mode("overwrite").save()


def compare_aggregate(args: argparse.Namespace, spark: SparkSession) -> None:
    progress(f"aggregate: {args.rows:,} rows, {args.keys:,} keys, parallelism {args.parallelism}")
    rows, keys, parallelism = args.rows, args.keys, args.parallelism
    seconds = alternating_seconds(
        {
            "auto": keyflow_pipeline(rows, keys, parallelism, "aggregate").run,
            "fixed": keyflow_pipeline(rows, keys, parallelism, "aggregate", auto=False).run,
            "peer": lambda: noop(
                source(rows, keys)
                .read(spark, parallelism)
                .groupBy("user")
                .agg(F.count("*").alias("clicks"), F.sum("price").alias("revenue"))
            ),
        },
        args.repeats,
    )
    metric = "keyed_count_sum" if rows == 20_000_000 else f"keyed_count_sum_{rows}_rows"
    emit_best_and_median("batch_keyed", metric, "s", seconds["auto"], "pyspark-groupBy-agg", seconds["peer"])
    emit_best_and_median(
        "batch_keyed", f"{metric}_fixed_parallelism", "s", seconds["fixed"], "pyspark-groupBy-agg", seconds["peer"]
    )


def compare_process(
    args: argparse.Namespace, spark: SparkSession, kind: str, peer: Callable[..., pd.DataFrame]
) -> None:
    """``process`` (with ``order_by``) or ``arrival`` (without) against applyInPandas."""
    cases = [(args.rows, args.keys)] + ([(args.many_keys_rows, args.many_keys)] if args.many_keys else [])
    for row_count, keys in cases:
        progress(f"running state ({kind}): {row_count:,} rows, {keys:,} keys")
        runs = {
            "keyflow": keyflow_pipeline(row_count, keys, args.parallelism, kind).run,
            "peer": lambda row_count=row_count, keys=keys: noop(
                source(row_count, keys).read(spark, args.parallelism).groupBy("user").applyInPandas(peer, SPEND_SCHEMA)
            ),
        }
        seconds = alternating_seconds(runs, args.repeats)
        name = "keyed_running_state" if kind == "process" else "keyed_running_state_arrival_order"
        metric = name if keys == args.keys else f"{name}_{row_count}_rows_{keys}_keys"
        emit_best_and_median("batch_keyed", metric, "s", seconds["keyflow"], "pyspark-applyInPandas", seconds["peer"])
        if keys == args.keys:  # one more run of each side, untimed, for the workers' memory
            peaks = {}
            for side, run in runs.items():
                with PeakWorkerMemory() as memory:
                    run()
                peaks[side] = memory.peak / 2**20
            emit("batch_keyed", f"{metric}_peak_worker_rss", "MiB", peaks["keyflow"], "pyspark-applyInPandas",
                 peaks["peer"])  # fmt: skip


if __name__ == "__main__":
    main()
