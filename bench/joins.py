"""Joins: keyflow's ``join`` and ``interval_join`` against Spark Structured Streaming's stream-stream inner joins.

Input: two directories of Parquet files written once with NumPy, one file per micro-batch
and side: ``orders(user string, order_id bigint)`` and ``visits(uid string, visit bigint)``,
users drawn uniformly from ``--keys`` (1M by default), so a key's rows of both sides arrive
over several micro-batches and most of them meet rows stored in earlier ones. Both systems
read both directories with Spark's file source, one file per side and micro-batch
(``maxFilesPerTrigger=1``), at parallelism 2, in one process, and join ``user = uid``
(inner). keyflow: ``orders.join(visits, on=[("user", "uid")])`` into ``blackhole()``;
Spark: ``orders.join(visits, expr("user = uid"))`` in append mode into ``noop``, with the
HDFS-backed state store (Spark's default) and with RocksDB. Neither side has a watermark:
a regular join keeps every row (Flink's and Spark's alike).

``--kind interval``: each side also has an event time (``ts`` / ``visit_ts``), micro-batch
``b``'s rows uniform in minute ``b``, and a watermark 10 s behind it on both systems; the
join also asks ``visit_ts`` within 30 s of ``ts``. keyflow: ``interval_join(...,
between=("-30 s", "30 s"))``; Spark: the same condition as a time-range join, whose state
it cleans by the watermark, as keyflow does.

Metric: input rows (both sides) per second over the steady micro-batches (all but the
first; Spark's trailing no-data batch, if any, counted in its time), each timed by Spark's
``triggerExecution`` on both sides (``bench.triggers``); and
the state each holds on disk at the end (keyflow's checkpoint, Spark's ``state``
directory). Before the figures both queries run on a small input and their joined rows
are checked against pandas' merge (the bench stops if either differs). Targets (issue 27):
>= 1.0x Spark's throughput at 1M keys, for each kind.

Run ``.venv/bin/python -m bench.joins [--kind regular|interval] [--runs 3] [--keys N] [--rows-per-batch N]
[--batches N]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.report import emit, progress
from bench.triggers import Triggers
from keyflow import Pipeline, WatermarkStrategy, blackhole, files, parquet
from keyflow.runtime.session import spark_session

BENCH = "joins"
PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
SIDES = {
    "orders": ("user string, order_id bigint", "user", "order_id"),
    "visits": ("uid string, visit bigint", "uid", "visit"),
}
TIMES = {"orders": "ts", "visits": "visit_ts"}  # --kind interval: each side's event time
WITHIN_S, BOUND_S = 30, 10  # visits within 30 s of the order; watermarks 10 s behind
TRIGGERS = Triggers()


def write_side(directory: Path, side: str, batches: int, rows: int, keys: int, seed: int, timed: bool) -> None:
    """One Parquet file per micro-batch of ``side``'s rows, keys uniform over ``keys``
    (``timed``: and an event time uniform in the batch's minute)."""
    _, key, number = SIDES[side]
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    names = pa.array([f"u{n}" for n in range(keys)], pa.string())
    for batch in range(batches):
        who = rng.integers(0, keys, rows)
        table = pa.table(
            {key: names.take(pa.array(who)), number: pa.array(np.arange(batch * rows, (batch + 1) * rows))}
        )
        if timed:
            micros = 1_700_000_000_000_000 + batch * 60_000_000 + rng.integers(0, 60_000_000, rows)
            table = table.append_column(TIMES[side], pa.array(micros, pa.timestamp("us", tz="UTC")))
        pq.write_table(table, directory / f"batch-{batch:04d}.parquet")


def schema(side: str, timed: bool) -> str:
    return SIDES[side][0] + (f", {TIMES[side]} timestamp" if timed else "")


def session(args: argparse.Namespace) -> SparkSession:
    spark = spark_session(
        {"spark.master": f"local[{args.parallelism}]", "spark.driver.memory": args.driver_memory}, app_name="bench"
    )
    TRIGGERS.attach(spark)
    spark.conf.set("spark.sql.shuffle.partitions", str(args.parallelism))
    return spark


def keyflow_join(args: argparse.Namespace, data: Path, work: Path, sink: Any) -> list[tuple[float, float, int]]:
    pipeline = Pipeline(
        parallelism=args.parallelism,
        config={"spark.master": f"local[{args.parallelism}]", "pipeline.progress": "off",
                "execution.checkpointing.interval": "0 s"},
    )  # fmt: skip
    timed = args.kind == "interval"
    orders, visits = (
        pipeline.source(
            files(data / side, schema=schema(side, timed), watch=True, maxFilesPerTrigger="1"),
            uid=side,
            watermark=WatermarkStrategy.for_bounded_out_of_orderness(TIMES[side], f"{BOUND_S} s") if timed else None,
        )
        for side in SIDES
    )
    if timed:
        joined = orders.interval_join(visits, on=[("user", "uid")], between=(f"-{WITHIN_S} s", f"{WITHIN_S} s"))
    else:
        joined = orders.join(visits, on=[("user", "uid")])
    joined.sink(sink)
    started = len(TRIGGERS.queries)
    result = pipeline.run(checkpoint=str(work), available_now=True)
    return TRIGGERS.of(TRIGGERS.queries[started], at_least=len(result.batches))


def spark_join(
    spark: SparkSession, data: Path, work: Path, provider: str, kind: str, path: Path | None = None
) -> list[tuple[float, float, int]]:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[provider])
    timed = kind == "interval"
    orders, visits = (
        spark.readStream.schema(schema(side, timed)).option("maxFilesPerTrigger", 1).parquet(str(data / side))
        for side in SIDES
    )
    condition, columns = "user = uid", ["user", "order_id", "visit"]
    if timed:
        orders, visits = (frame.withWatermark(TIMES[side], f"{BOUND_S} seconds") for side, frame in
                          (("orders", orders), ("visits", visits)))  # fmt: skip
        condition += f" AND visit_ts BETWEEN ts - INTERVAL {WITHIN_S} SECONDS AND ts + INTERVAL {WITHIN_S} SECONDS"
        columns += ["ts", "visit_ts"]
    joined = orders.join(visits, F.expr(condition)).select(*columns)
    writer = joined.writeStream.outputMode("append").option("checkpointLocation", str(work))
    writer = writer.format("parquet").option("path", str(path)) if path is not None else writer.format("noop")
    started = len(TRIGGERS.queries)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    count = max(p["batchId"] for p in query.recentProgress) + 1
    return TRIGGERS.of(TRIGGERS.queries[started], at_least=count)


def steady_rate(rows: int, batches: list[tuple[float, float, int]]) -> float:
    """``rows`` (the input of the data batches after the first) per second of every batch after
    the first (start-up and compilation). Known rows, not Spark's ``numInputRows``: keyflow's
    micro-batch reads its sources in more than one Spark job, which Spark counts each time."""
    return rows / sum(b[1] for b in batches[1:])


def size_on_disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def data_set(work: Path, name: str, args: argparse.Namespace, keys: int, rows: int, batches: int) -> Path:
    data = work / name
    for seed, side in enumerate(SIDES):
        write_side(data / side, side, batches, rows, keys, seed=seed + 1, timed=args.kind == "interval")
    return data


def expected(data: Path, kind: str) -> pd.DataFrame:
    """pandas' inner join of both sides (``interval``: and the time condition)."""
    sides = {side: pd.read_parquet(data / side) for side in SIDES}
    joined = sides["orders"].merge(sides["visits"], left_on="user", right_on="uid")
    if kind == "interval":
        within = (joined.visit_ts - joined.ts).abs() <= pd.Timedelta(seconds=WITHIN_S)
        joined = joined[within]
    return joined[["user", "order_id", "visit"]]


def check(work: Path, args: argparse.Namespace) -> None:
    """Both queries give pandas' inner join on a small input, or the bench stops."""
    data = data_set(work, "check", args, keys=500, rows=2_000, batches=3)
    spark = session(args)
    keyflow_join(args, data, work / "check-kf", parquet(str(work / "check-kf-out")))
    spark_join(spark, data, work / "check-ss", "hdfs", args.kind, work / "check-ss-out")
    want = expected(data, args.kind)
    for name, out in (("keyflow", work / "check-kf-out"), ("spark", work / "check-ss-out")):
        got = pd.read_parquet(out)[["user", "order_id", "visit"]]
        ordered = [frame.sort_values(["order_id", "visit"]).reset_index(drop=True) for frame in (got, want)]
        pd.testing.assert_frame_equal(*ordered, check_dtype=False, obj=f"{name}'s join")
    progress(f"  check: both joins equal pandas' ({len(want)} rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("regular", "interval"), default="regular")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rows-per-batch", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--driver-memory", default="4g")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix=f"bench-joins-{args.kind}-"))
    try:
        check(work, args)
        data = data_set(work, "data", args, args.keys, args.rows_per_batch, args.batches)
        spark = session(args)
        rates: dict[str, list[float]] = {"keyflow": [], "hdfs": [], "rocksdb": []}
        sizes: dict[str, int] = {}
        for run in range(args.runs):
            for name in rates:
                target = work / f"{name}-{run}"
                if name == "keyflow":
                    times = keyflow_join(args, data, target, blackhole())
                else:
                    times = spark_join(spark, data, target, name, args.kind)
                rates[name].append(steady_rate(2 * args.rows_per_batch * (args.batches - 1), times))
                sizes[name] = size_on_disk(target if name == "keyflow" else target / "state")
                progress(
                    f"  run {run} {name}: {rates[name][-1]:,.0f} rows/s, batches {[round(t[1], 2) for t in times]}"
                )
                shutil.rmtree(target, ignore_errors=True)
        what = "inner join" if args.kind == "regular" else f"inner interval join (+-{WITHIN_S} s)"
        metric = f"{what} {args.keys:,} keys, input rows/s"
        for peer in ("hdfs", "rocksdb"):
            label = f"Spark SS stream-stream {'' if args.kind == 'regular' else 'time-range '}join ({peer} state store)"
            emit(BENCH, f"{metric} (best of {args.runs})", "rows/s", max(rates["keyflow"]), label, max(rates[peer]))
            emit(BENCH, f"{metric} (median of {args.runs})", "rows/s", statistics.median(rates["keyflow"]), label,
                 statistics.median(rates[peer]))  # fmt: skip
            emit(
                BENCH,
                f"{what}: state on disk after the run ({args.keys:,} keys)",
                "bytes",
                sizes["keyflow"],
                label,
                sizes[peer],
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
