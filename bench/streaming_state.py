"""Streaming keyed state: keyflow against Spark Structured Streaming on the same micro-batches.

Input: Parquet files written once with NumPy (``--files`` x ``--rows-per-file`` rows of
``k long, v double``); both systems read one file per micro-batch from a watched directory.

1. Running count + sum per key (10k and 1M keys): keyflow ``aggregate`` vs Structured
   Streaming's ``groupBy().agg()`` in update mode with the HDFS-backed and the RocksDB state
   store. Metric: rows/s over the steady batches (all but the first), each batch timed by
   Spark's ``triggerExecution`` on both sides; best and median of ``--runs`` runs. Targets
   (issue 16): keyflow >= 1.0x the faster Spark provider at 10k keys, >= 2.5x at 1M.
2. State-size scaling: the first batch creates ``N`` keys of state (100k, then 10M), then
   batches of the same size touch 100k of them. Metric: median batch time after the first
   two (creation, one more to settle) with 10M keys / with 100k keys. Target ≤ 2 (peer:
   the same with RocksDB).
3. Rescale cost: a live keyflow rescale 2→4 and 4→2; the first batch after it vs the median
   steady batch (target ≤ 2x) and the bytes of existing state files rewritten (target 0).
   Structured Streaming cannot change the number of state partitions of a query: no peer.
4. Cost of a larger K: the same stream (1M keys) with K=128 and K=27720 key groups: median
   batch time and state bytes per batch (state files are per key-group range, so K should
   not matter).

Both sides end in a sink that discards rows (keyflow ``blackhole``, Spark ``noop``) and run
at the same parallelism (Spark's ``spark.sql.shuffle.partitions``). Run
``.venv/bin/python -m bench.streaming_state`` (defaults: 10 files x 2M rows, parallelism 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.report import emit, emit_best_and_median, progress
from bench.triggers import Triggers
from keyflow import Pipeline, blackhole, files
from keyflow.runtime.session import spark_session
from keyflow.runtime.streaming import BatchMetrics

PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


def write_batches(directory: Path, batches: list[np.ndarray], seed: int) -> None:
    """One Parquet file per micro-batch, named so they are read in order."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for number, keys in enumerate(batches):
        table = pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(rng.uniform(0, 100, len(keys)))})
        pq.write_table(table, directory / f"batch-{number:04d}.parquet")


def uniform_batches(count: int, rows: int, keys: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, keys, rows) for _ in range(count)]


def keyflow_run(
    data: Path,
    work: Path,
    parallelism: int,
    rescale: list[int] | None = None,
    max_parallelism: int = 27720,
    where: str = "true",
) -> list[BatchMetrics]:
    """All batches through a keyflow streaming aggregate; ``rescale[i]`` is the parallelism from batch i.
    Without a rescale each batch's ``seconds`` is Spark's ``triggerExecution`` of it, the peer's measure."""
    TRIGGERS.attach(spark_session({"spark.master": f"local[{parallelism}]"}, app_name="bench"))
    pipeline = Pipeline(
        parallelism=parallelism,
        config={
            "spark.master": f"local[{parallelism}]",
            "pipeline.progress": "off",
            "execution.checkpointing.interval": "0 s",
            "pipeline.max-parallelism": max_parallelism,
        },
    )
    source = files(data, schema="k long, v double", watch=True, maxFilesPerTrigger="1")
    pipeline.source(source).filter(where).key_by("k").aggregate(n="count(*)", s="sum(v)").sink(blackhole())
    if rescale is None:
        started = len(TRIGGERS.queries)
        batches = pipeline.run(checkpoint=str(work / "ckpt"), available_now=True).batches
        seconds = TRIGGERS.seconds(TRIGGERS.queries[started], [b.batch for b in batches])
        return [dataclasses.replace(b, seconds=s) for b, s in zip(batches, seconds, strict=True)]
    job = pipeline.start(checkpoint=str(work / "ckpt"))
    metrics: list[BatchMetrics] = []
    try:
        while len(metrics) < len(rescale):
            time.sleep(0.05)
            metrics = list(job.result.batches)
            if metrics and len(metrics) < len(rescale) and rescale[len(metrics)] != job.parallelism:
                job.rescale(rescale[len(metrics)], reason="benchmark")
    finally:
        job.stop()
    return metrics


TRIGGERS = Triggers()


def spark_run(spark: SparkSession, data: Path, work: Path, provider: str, where: str = "true") -> list[float]:
    """The same aggregate as a Structured Streaming query; seconds per micro-batch."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[provider])
    stream = spark.readStream.schema("k long, v double").option("maxFilesPerTrigger", 1).parquet(str(data))
    query = (
        stream.filter(where)
        .groupBy("k")
        .agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(work / f"spark-{provider}"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress if p["numInputRows"] > 0]


def fixed_cost(work: Path, args: argparse.Namespace) -> None:
    """What a micro-batch costs where there is almost nothing to do: 1,000 rows (1,000 keys),
    and the same batches with a filter that leaves the aggregate no row. Median of the steady
    batches, best and median of ``--runs`` runs; both sides timed by Spark's triggerExecution."""
    data = work / "small"
    write_batches(data, uniform_batches(args.files, 1_000, 1_000, seed=7), seed=7)
    spark = spark_session({"spark.master": f"local[{args.parallelism}]"}, app_name="bench")
    # v * 0 > 1 holds for no row, and Parquet cannot skip on it: every side still reads its rows.
    for label, where in (("1000 rows, 1000 keys", "true"), ("empty after a filter", "v * 0 > 1")):
        medians: dict[str, list[float]] = {"keyflow": [], "peer": []}
        for run in range(args.runs):
            progress(f"micro-batch fixed cost, {label}, run {run + 1}/{args.runs}")
            name = f"{label[:5].strip()}-{run}"
            batches = keyflow_run(data, work / f"kf-small-{name}", args.parallelism, where=where)
            medians["keyflow"].append(statistics.median(b.seconds for b in batches[1:]))
            spark.conf.set("spark.sql.shuffle.partitions", str(args.parallelism))
            medians["peer"].append(
                statistics.median(spark_run(spark, data, work / f"ss-small-{name}", "hdfs", where)[1:])
            )
        emit_best_and_median(
            "streaming_state", f"micro-batch time, {label} (median steady batch)", "s", medians["keyflow"],
            "Structured Streaming hdfs state store", medians["peer"],
        )  # fmt: skip


def steady_rate(rows: int, seconds: list[float]) -> float:
    """Rows per second over the steady batches (the first pays start-up and compilation)."""
    steady = seconds[1:]
    return rows * len(steady) / sum(steady)


def warm_up(work: Path, args: argparse.Namespace) -> None:
    """One small run of each system first, so neither pays the JVM's and workers' warm-up in a figure."""
    data = work / "warm-up"
    write_batches(data, uniform_batches(3, 200_000, 1_000, seed=0), seed=0)
    keyflow_run(data, work / "kf-warm-up", args.parallelism)
    spark = spark_session({"spark.master": f"local[{args.parallelism}]"}, app_name="bench")
    for provider in PROVIDERS:
        spark_run(spark, data, work / "ss-warm-up", provider)


def throughput(work: Path, args: argparse.Namespace, keys: int) -> None:
    """keyflow and both Spark state stores, ``--runs`` times each on a fresh checkpoint,
    alternating; best and median of the runs' steady rates."""
    data = work / f"uniform-{keys}"
    write_batches(data, uniform_batches(args.files, args.rows_per_file, keys, seed=keys), seed=1)
    spark = spark_session({"spark.master": f"local[{args.parallelism}]"}, app_name="bench")
    rates: dict[str, list[float]] = {"keyflow": [], **{provider: [] for provider in PROVIDERS}}
    for run in range(args.runs):
        progress(f"keyed count+sum, {keys:,} keys, run {run + 1}/{args.runs}: keyflow")
        batches = keyflow_run(data, work / f"kf-{keys}-{run}", args.parallelism)
        rates["keyflow"].append(steady_rate(args.rows_per_file, [b.seconds for b in batches]))
        spark.conf.set("spark.sql.shuffle.partitions", str(args.parallelism))
        for provider in PROVIDERS:
            progress(f"keyed count+sum, {keys:,} keys, run {run + 1}/{args.runs}: Structured Streaming ({provider})")
            seconds = spark_run(spark, data, work / f"ss-{keys}-{run}", provider)
            rates[provider].append(steady_rate(args.rows_per_file, seconds))
    best = max(PROVIDERS, key=lambda p: statistics.median(rates[p]))
    for provider in PROVIDERS:
        for label, pick in (("best", max), ("median", statistics.median)):
            emit(
                "streaming_state",
                f"running count+sum {keys} keys, {args.rows_per_file} rows/batch: throughput ({label} of "
                f"{args.runs} runs)",
                "rows/s",
                pick(rates["keyflow"]),
                f"Structured Streaming {provider} state store" + (" (faster provider)" if provider == best else ""),
                pick(rates[provider]),
            )


def scaling(work: Path, args: argparse.Namespace) -> None:
    """Median steady batch time with a small and a large state, same batch size."""
    hot = 100_000
    medians: dict[tuple[str, int], float] = {}
    for state_keys in (hot, args.large_state):
        data = work / f"state-{state_keys}"
        rng = np.random.default_rng(7)
        batches = [np.arange(state_keys, dtype=np.int64)]
        batches += [rng.integers(0, hot, args.rows_per_file) for _ in range(args.scaling_batches)]
        write_batches(data, batches, seed=2)
        progress(f"state scaling, {state_keys:,} keys of state: keyflow")
        seconds = [b.seconds for b in keyflow_run(data, work / f"kf-state-{state_keys}", args.parallelism)]
        medians["keyflow", state_keys] = statistics.median(seconds[2:])
        progress(f"  keyflow batches: {[round(s, 2) for s in seconds]}")
        spark = spark_session({"spark.master": f"local[{args.parallelism}]"}, app_name="bench")
        spark.conf.set("spark.sql.shuffle.partitions", str(args.parallelism))
        progress(f"state scaling, {state_keys:,} keys of state: Structured Streaming (rocksdb)")
        peer = spark_run(spark, data, work / f"ss-state-{state_keys}", "rocksdb")
        medians["rocksdb", state_keys] = statistics.median(peer[2:])
        progress(f"  Structured Streaming batches: {[round(s, 2) for s in peer]}")
    emit(
        "streaming_state",
        f"per-batch time with {args.large_state} keys of state / with {hot} (median steady batch)",
        "ratio",
        medians["keyflow", args.large_state] / medians["keyflow", hot],
        "Structured Streaming rocksdb state store: same ratio",
        medians["rocksdb", args.large_state] / medians["rocksdb", hot],
    )


def rescale_cost(work: Path, args: argparse.Namespace) -> None:
    data = work / "rescale"
    count = 9
    write_batches(data, uniform_batches(count, args.rows_per_file, 100_000, seed=3), seed=3)
    plan = [2, 2, 2, 4, 4, 4, 2, 2, 2]  # parallelism per batch: rescale before batches 3 and 6
    progress("rescale 2→4→2: keyflow (live)")
    checkpoint = work / "kf-rescale" / "ckpt"
    metrics = keyflow_run(data, work / "kf-rescale", 2, rescale=plan)
    changed = [i for i in range(1, len(metrics)) if metrics[i].parallelism != metrics[i - 1].parallelism]
    steady = statistics.median([m.seconds for i, m in enumerate(metrics) if i and i not in changed])
    progress(f"  batches (parallelism, seconds): {[(m.parallelism, round(m.seconds, 2)) for m in metrics]}")
    for index in changed:
        label = f"{metrics[index - 1].parallelism}→{metrics[index].parallelism}"
        emit("streaming_state", f"first batch after live rescale {label} / steady batch", "ratio",
             metrics[index].seconds / steady, None, None)  # fmt: skip
    emit("streaming_state", "bytes of existing state files rewritten by the rescales", "bytes",
         float(rewritten_bytes(checkpoint)), None, None)  # fmt: skip


def k_cost(work: Path, args: argparse.Namespace) -> None:
    """The same stream with few and many key groups: state bytes and steady batch time."""
    data = work / "k-cost"
    write_batches(data, uniform_batches(6, args.rows_per_file // 2, 1_000_000, seed=5), seed=5)
    figures = {}
    for max_parallelism in (128, 27720):
        progress(f"cost of K: keyflow with {max_parallelism} key groups")
        metrics = keyflow_run(data, work / f"kf-k-{max_parallelism}", args.parallelism, max_parallelism=max_parallelism)
        figures[max_parallelism] = (statistics.median(m.seconds for m in metrics[1:]), metrics[-1].state_bytes_written)
    emit("streaming_state", "median batch time, K=27720 vs K=128 (1M keys of state)", "s",
         figures[27720][0], "keyflow with K=128", figures[128][0])  # fmt: skip
    emit("streaming_state", "state bytes written per batch, K=27720 vs K=128", "bytes",
         float(figures[27720][1]), "keyflow with K=128", float(figures[128][1]))  # fmt: skip


def rewritten_bytes(checkpoint: Path) -> int:
    """State files are written once, under the version that wrote them: a file modified after
    its version's manifest was committed would be a rewrite."""
    rewritten = 0
    for manifest in (checkpoint / "manifests").glob("*.json"):
        committed = manifest.stat().st_mtime_ns
        version_dir = f"v-{manifest.stem}"
        for state_file in (checkpoint / "state").glob(f"op-*/{version_dir}/*.parquet"):
            if state_file.stat().st_mtime_ns > committed:
                rewritten += state_file.stat().st_size
    return rewritten


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--rows-per-file", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--large-state", type=int, default=10_000_000)
    parser.add_argument("--scaling-batches", type=int, default=6)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3, help="runs of each system in the throughput comparison")
    parser.add_argument("--only", choices=["throughput", "fixed-cost", "scaling", "rescale", "k-cost"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="keyflow-bench-"))
    try:
        progress("warm-up")
        warm_up(work, args)
        if args.only in (None, "throughput"):
            for keys in args.keys:
                throughput(work, args, keys)
        if args.only in (None, "fixed-cost"):
            fixed_cost(work, args)
        if args.only in (None, "scaling"):
            scaling(work, args)
        if args.only in (None, "rescale"):
            rescale_cost(work, args)
        if args.only in (None, "k-cost"):
            k_cost(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
