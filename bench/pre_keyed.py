"""A pre-keyed log source against ``key_by`` on the same log: what skipping the shuffle saves.

Input: one :class:`keyflow.Log` of ``--splits`` splits (``user long, amount long, seq long``,
``--keys`` users drawn uniformly), written once with NumPy and appended with
``key="user"``, so every user is in one split; ``--batches`` x ``--rows-per-batch`` rows,
read back one micro-batch of ``--rows-per-batch`` rows at a time (``log(rows_per_batch=)``).
Every run is a keyflow streaming job (``available_now``) on a fresh checkpoint, ending in
``blackhole()``, at the same parallelism (``local[P]``):

1. Pre-keyed vs key_by, for two keyed operators: a running ``aggregate`` (count, sum of
   amount per user; ``key_by`` shuffles one partial row per key and micro-batch) and a
   ``process`` keeping each user's running total in ``ValueState`` ordered by ``seq``
   (``key_by`` shuffles every row). ``reinterpret_as_keyed("user")`` right after the source
   runs the operator in the source's partitions. Metrics: wall time per micro-batch (the
   median of the steady batches of a run, all but the first, as ``BatchMetrics.seconds``
   measures it), best and median over ``--runs`` runs; shuffle bytes per micro-batch (what
   Spark's shuffle wrote during the run, from its status API, over the run's batches; the
   largest of the runs). Target: pre-keyed <= 0.7x the key_by time at 2M rows per batch,
   and 0 shuffle bytes.
2. Cost of the check: the pre-keyed run with ``pipeline.pre-keyed.verify`` ``fail`` (the
   default: workers report keys, the driver checks no key is in two splits before commit)
   against ``off``; same metric.

The variants of a run go one after the other on the same data, runs repeat the set, and a
small warm-up run of each comes first. Run ``.venv/bin/python -m bench.pre_keyed`` (defaults:
5 micro-batches of 2M rows, 100k keys, 8 splits, parallelism 2, 3 runs).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession

from bench.report import emit, progress
from keyflow import KeyedBatch, KeyedState, Log, Pipeline, ValueState, blackhole
from keyflow.connectors.streams import log
from keyflow.runtime.metrics import ShuffleMeter
from keyflow.runtime.session import spark_session
from keyflow.runtime.streaming import BatchMetrics

SCHEMA = pa.schema([("user", pa.int64()), ("amount", pa.int64()), ("seq", pa.int64())])
TOTAL_SCHEMA = "user long, seq long, total long"
VARIANTS = {  # name: (pre-keyed, pipeline.pre-keyed.verify)
    "pre-keyed": (True, "fail"),
    "key_by": (False, "fail"),
    "pre-keyed, verify off": (True, "off"),
}


def running_total(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Per user: the running total of ``amount`` after each event (events ordered by ``seq``)."""
    total = state["total"]
    running = batch.running_sum(batch.data.column("amount"), total.get())
    total.update(batch.last_per_key(running))
    return pa.table({"user": batch.data.column("user"), "seq": batch.data.column("seq"), "total": running})


def write_log(path: Path, rows_per_batch: int, batches: int, keys: int, splits: int, seed: int) -> None:
    """``batches`` appends of ``rows_per_batch`` rows, each user to one split (``key="user"``)."""
    rng = np.random.default_rng(seed)
    target = Log.create(path, splits, SCHEMA)
    for number in range(batches):
        first = number * rows_per_batch
        table = pa.table(
            {
                "user": rng.integers(0, keys, rows_per_batch, dtype=np.int64),
                "amount": rng.integers(1, 1_000, rows_per_batch, dtype=np.int64),
                "seq": np.arange(first, first + rows_per_batch, dtype=np.int64),
            },
            schema=SCHEMA,
        )
        target.append(table, key="user")


def settings(parallelism: int) -> dict[str, object]:
    return {
        "spark.master": f"local[{parallelism}]",
        # shuffle bytes are summed over the stages the Spark UI keeps: keep them all
        "spark.ui.retainedStages": "100000",
        "spark.ui.retainedJobs": "100000",
        "pipeline.progress": "off",
        "parallelism.default": parallelism,
        "execution.checkpointing.interval": "0 s",
    }


def run_once(
    spark: SparkSession, data: Path, checkpoint: Path, args: argparse.Namespace, operator: str, variant: str
) -> tuple[list[BatchMetrics], int]:
    """One streaming run of ``operator`` read as ``variant``; its batches and the bytes it shuffled."""
    pre_keyed, verify = VARIANTS[variant]
    pipeline = Pipeline(config={**settings(args.parallelism), "pipeline.pre-keyed.verify": verify})
    source = pipeline.source(log(str(data), rows_per_batch=args.rows_per_batch))
    keyed = source.reinterpret_as_keyed("user") if pre_keyed else source.key_by("user")
    if operator == "aggregate":
        keyed.aggregate(n="count(*)", total="sum(amount)").sink(blackhole())
    else:
        keyed.process(running_total, TOTAL_SCHEMA, state={"total": ValueState("int64")}, order_by="seq").sink(
            blackhole()
        )
    meter = ShuffleMeter(spark)
    try:
        batches = pipeline.run(checkpoint=str(checkpoint), available_now=True).batches
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    return batches, meter.written()


def check_batches(batches: list[BatchMetrics], args: argparse.Namespace, label: str) -> None:
    """Every figure assumes ``--batches`` micro-batches of ``--rows-per-batch`` rows and no conflicts."""
    rows = [b.input_rows for b in batches]
    if len(batches) != args.batches or any(r not in (None, args.rows_per_batch) for r in rows):
        progress(f"  WARNING {label}: {len(batches)} micro-batches of {rows} rows, expected {args.batches} x "
                 f"{args.rows_per_batch}")  # fmt: skip
    if any(b.pre_keyed_conflicts for b in batches):
        progress(f"  WARNING {label}: keys in two splits: {[b.pre_keyed_conflicts for b in batches]}")


def compare(spark: SparkSession, work: Path, data: Path, args: argparse.Namespace, operator: str) -> None:
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    shuffle: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for run in range(args.runs):
        for variant in VARIANTS:
            label = f"{operator}, {variant}, run {run}"
            checkpoint = work / f"ckpt-{operator}-{variant.replace(' ', '').replace(',', '-')}-{run}"
            batches, shuffled = run_once(spark, data, checkpoint, args, operator, variant)
            check_batches(batches, args, label)
            steady = [b.seconds for b in batches[1:]] or [b.seconds for b in batches]
            times[variant].append(statistics.median(steady))
            shuffle[variant].append(shuffled / max(len(batches), 1))
            progress(f"{label}: batches {[round(b.seconds, 2) for b in batches]} s, median steady "
                     f"{times[variant][-1]:.3f} s, shuffle {shuffled:,} bytes")  # fmt: skip
    size = f"{args.rows_per_batch} rows/batch, {args.keys} keys, {args.splits} splits, parallelism {args.parallelism}"
    what = {
        "aggregate": "running aggregate (count, sum)",
        "process": "process with ValueState (running total, order_by seq)",
    }[operator]
    for statistic, pick in (("best", min), ("median", statistics.median)):
        emit(
            "pre_keyed",
            f"{what}: time per micro-batch, pre-keyed log, {size} (median steady batch, {statistic} of {args.runs})",
            "s",
            pick(times["pre-keyed"]),
            "keyflow key_by (shuffle) on the same log",
            pick(times["key_by"]),
        )
    emit(
        "pre_keyed",
        f"{what}: shuffle bytes per micro-batch, pre-keyed log, {size} (largest of {args.runs})",
        "bytes",
        max(shuffle["pre-keyed"]),
        "keyflow key_by (shuffle) on the same log",
        max(shuffle["key_by"]),
    )
    for statistic, pick in (("best", min), ("median", statistics.median)):
        emit(
            "pre_keyed",
            f"{what}: time per micro-batch, pre-keyed log with pipeline.pre-keyed.verify=fail, {size} "
            f"(median steady batch, {statistic} of {args.runs})",
            "s",
            pick(times["pre-keyed"]),
            "keyflow pre-keyed, pipeline.pre-keyed.verify=off",
            pick(times["pre-keyed, verify off"]),
        )


def warm_up(spark: SparkSession, work: Path, args: argparse.Namespace) -> None:
    """A small run of every variant first, so no figure pays the JVM's and workers' warm-up."""
    data = work / "warm-up-log"
    small = argparse.Namespace(**{**vars(args), "rows_per_batch": min(args.rows_per_batch, 100_000), "batches": 2})
    write_log(data, small.rows_per_batch, small.batches, min(args.keys, 10_000), args.splits, seed=0)
    for operator in args.operators:
        for variant in VARIANTS:
            run_once(spark, data, work / "ckpt-warm-up", small, operator, variant)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows-per-batch", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--splits", type=int, default=8)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["aggregate", "process"], help="run one of the two operators")
    args = parser.parse_args()
    args.operators = [args.only] if args.only else ["aggregate", "process"]
    work = Path(tempfile.mkdtemp(prefix="keyflow-bench-pre-keyed-"))
    try:
        spark = spark_session(settings(args.parallelism), app_name="keyflow-bench")
        progress(f"writing {args.batches} x {args.rows_per_batch:,} rows, {args.keys:,} keys, {args.splits} splits")
        data = work / "log"
        write_log(data, args.rows_per_batch, args.batches, args.keys, args.splits, seed=1)
        progress("warm-up")
        warm_up(spark, work, args)
        for operator in args.operators:
            compare(spark, work, data, args, operator)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
