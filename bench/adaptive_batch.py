"""Adaptive batch parallelism on a Zipf-skewed keyed job, side by side in one process.

Input: ``--rows`` rows (``key long, amount long, seq long``) in 8 Parquet files, keys drawn
from ``--keys`` keys with Zipf exponent ``--exponent`` (ranks shuffled over key ids, so hot
keys land in random key groups), written once with NumPy. The work: each key's running
total of ``amount`` in ``seq`` order, written to a no-op sink.

1. keyflow with auto-parallelism (the defaults: 16 MiB per task, at most the task slots):
   the keyed stage's parallelism and key-group ranges decided from its shuffle bytes.
2. keyflow at a fixed parallelism (the same number of task slots, auto-parallelism off):
   Flink's even key-group ranges.
3. Plain PySpark with adaptive query execution on (Spark's defaults):
   ``groupBy("key").applyInPandas`` computing the same running totals.

Figures (best and median of ``--runs``): wall time; the decided parallelism; max/mean of
the keyed stage's tasks' shuffle bytes read and run time (Spark's task metrics). Targets:
max/mean task bytes <= 1.1 for keyflow adaptive, wall time <= the better of the two peers.
Then the cost of deciding: uniform keys (nothing to balance), ``--overhead-rows`` rows,
adaptive against fixed. Run ``.venv/bin/python -m bench.adaptive_batch``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from bench.report import emit, progress
from keyflow import KeyedBatch, KeyedState, Pipeline, ValueState, blackhole, files
from keyflow.runtime.executor import RunResult
from keyflow.runtime.metrics import ShuffleMeter
from keyflow.runtime.session import spark_session

SCHEMA = "key long, seq long, total long"
AUTO = "execution.batch.adaptive.auto-parallelism."


def write_input(path: Path, rows: int, keys: int, exponent: float | None, seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    if exponent is None:
        drawn = rng.integers(0, keys, rows)
    else:
        weights = np.arange(1, keys + 1, dtype=np.float64) ** -exponent
        drawn = rng.permutation(keys)[np.searchsorted(np.cumsum(weights / weights.sum()), rng.random(rows))]
        drawn = np.minimum(drawn, keys - 1)
    path.mkdir(parents=True)
    for number, part in enumerate(np.array_split(np.arange(rows), 8)):
        table = pa.table({"key": drawn[part].astype(np.int64), "amount": rng.integers(1, 100, part.size), "seq": part})
        pq.write_table(table, path / f"part-{number}.parquet")


def running_total(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    total = state["total"]
    running = batch.running_sum(batch.data.column("amount"), total.get())
    total.update(batch.last_per_key(running))
    return pa.table({"key": batch.data.column("key"), "seq": batch.data.column("seq"), "total": running})


def running_total_pandas(group: pd.DataFrame) -> pd.DataFrame:
    ordered = group.sort_values("seq")
    return pd.DataFrame({"key": ordered.key, "seq": ordered.seq, "total": ordered.amount.cumsum()})


def keyflow_run(data: Path, slots: int, adaptive: bool) -> RunResult:
    config = {"spark.master": f"local[{slots}]", "pipeline.progress": "off", AUTO + "enabled": adaptive}
    p = Pipeline(parallelism=slots, config=config)
    p.source(files(str(data))).key_by("key").process(
        running_total, SCHEMA, state={"total": ValueState("int64")}, order_by="seq"
    ).sink(blackhole())
    result = p.run()
    assert isinstance(result, RunResult)
    return result


def peer_run(spark: SparkSession, data: Path) -> None:
    spark.conf.unset("spark.sql.shuffle.partitions")  # Spark's default (200), which keyflow's runs set to P
    frame = spark.read.parquet(str(data)).groupBy("key").applyInPandas(running_total_pandas, SCHEMA)
    frame.write.format("noop").mode("overwrite").save()


def measure(spark: SparkSession, action: Callable[[], object]) -> tuple[float, float, float, object]:
    """Wall seconds; max/mean task shuffle bytes and run time of the keyed stage; the result."""
    meter = ShuffleMeter(spark)
    start = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - start
    tasks = meter.busiest_reader()  # empty tasks count: they are part of the imbalance
    read, ran = np.array([t[0] for t in tasks], dtype=float), np.array([t[1] for t in tasks], dtype=float)
    return seconds, read.max() / read.mean(), ran.max() / max(ran.mean(), 1e-9), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--exponent", type=float, default=1.1)
    parser.add_argument("--overhead-rows", type=int, default=5_000_000)
    parser.add_argument("--parallelism", type=int, default=2, help="task slots (local[N])")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-peer", action="store_true", help="leave out the PySpark peer (it is slow)")
    args = parser.parse_args()
    spark = spark_session({"spark.master": f"local[{args.parallelism}]"}, app_name="keyflow-bench")
    work = Path(tempfile.mkdtemp(prefix="keyflow-bench-adaptive-"))
    try:
        progress(
            f"writing {args.rows:,} rows, {args.keys:,} keys, Zipf {args.exponent}; {args.overhead_rows:,} uniform"
        )
        write_input(work / "zipf", args.rows, args.keys, args.exponent)
        write_input(work / "uniform", args.overhead_rows, args.keys, None)
        progress("warm-up")  # the JVM's and the Python workers' first jobs are slow
        for adaptive in (True, False):
            keyflow_run(work / "uniform", args.parallelism, adaptive)
        if not args.skip_peer:
            peer_run(spark, work / "uniform")
        variants: dict[str, Callable[[], object]] = {
            "keyflow-adaptive": lambda: keyflow_run(work / "zipf", args.parallelism, adaptive=True),
            "keyflow-fixed": lambda: keyflow_run(work / "zipf", args.parallelism, adaptive=False),
        }
        if not args.skip_peer:
            variants["pyspark-aqe-applyInPandas"] = lambda: peer_run(spark, work / "zipf")
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
        decided = []
        for run in range(args.runs):
            for name, action in variants.items():
                progress(f"run {run + 1}/{args.runs}: {name}")
                seconds, bytes_ratio, time_ratio, result = measure(spark, action)
                figures[name].append((seconds, bytes_ratio, time_ratio))
                if isinstance(result, RunResult) and result.stages:
                    decided.append(result.stages[0].decision.parallelism)
        report(figures, decided)

        progress(f"overhead: {args.overhead_rows:,} uniform rows")
        overhead = {True: [], False: []}
        for _ in range(args.runs):
            for adaptive in (True, False):
                overhead[adaptive].append(
                    measure(spark, lambda a=adaptive: keyflow_run(work / "uniform", args.parallelism, a))[0]
                )
        emit("adaptive_batch", "uniform_wall_time", "s", min(overhead[True]), "keyflow-fixed", min(overhead[False]))
        emit("adaptive_batch", "uniform_wall_time_median", "s", statistics.median(overhead[True]), "keyflow-fixed",
             statistics.median(overhead[False]))  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(figures: dict[str, list[tuple[float, float, float]]], decided: list[int]) -> None:
    mine = figures["keyflow-adaptive"]
    emit("adaptive_batch", "decided_parallelism", "subtasks", statistics.median(decided), None, None)
    for peer, theirs in figures.items():
        if peer == "keyflow-adaptive":
            continue
        for column, metric, unit in (
            (0, "wall_time", "s"),
            (1, "max_mean_task_bytes", "x"),
            (2, "max_mean_task_time", "x"),
        ):
            best = min(run[column] for run in mine), min(run[column] for run in theirs)
            median = statistics.median(run[column] for run in mine), statistics.median(run[column] for run in theirs)
            emit("adaptive_batch", metric, unit, best[0], peer, best[1])
            emit("adaptive_batch", f"{metric}_median", unit, median[0], peer, median[1])


if __name__ == "__main__":
    main()
