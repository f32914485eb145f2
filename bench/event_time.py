"""Event time: keyflow's windows and timers against Spark Structured Streaming on the same micro-batches.

Input: Parquet files written once with NumPy, one per micro-batch, each holding one minute
of event time (``user string, ts timestamp``, millisecond timestamps): rows are in arrival
order, each user's rows arriving a fixed 0-5 s after they happened (so a file is out of
order by up to 5 s; each user's own rows are in order). Both systems read the same
directory with Spark's file source, one file per micro-batch (``maxFilesPerTrigger=1``),
with a watermark of 10 s out of orderness, at parallelism 2 (Spark's
``spark.sql.shuffle.partitions``), in one process.

1. ``tumbling``: a 1-minute tumbling count per user (10k users and 1M users), keyflow
   ``window(tumbling("1 min")).aggregate(n="count(*)")`` vs
   ``withWatermark("ts", "10 seconds").groupBy(window("ts", "1 minute"), "user").count()``
   in append mode with the HDFS-backed and the RocksDB state store; both end in a sink that
   discards rows (keyflow ``blackhole``, Spark ``noop``). Metric: rows/s over the steady
   micro-batches (all but the first), each timed by Spark's ``triggerExecution`` on both
   sides; Spark's trailing no-data micro-batch (it emits the windows the last data batch
   closed, which keyflow emits in that batch) is counted in its time. Targets: >= 1.0x
   Spark at 10k users, >= 2x at 1M.
2. ``sessions``: sessions per user with a 30 s inactivity gap (one row per finished session:
   user, start, end = last event + gap, n), keyflow ``process`` with event-time timers and
   ``on_timer`` vs Spark 4's ``transformWithStateInPandas`` with event-time timers (RocksDB,
   the only state store it runs on). Half of the users are active in any minute, so
   sessions open and close all the time. Both are first checked against each other and a
   pandas reference on a small input (the bench stops if they differ). Metric: steady rows/s
   as in 1. Target >= 2x. ``transformWithStateInPandas`` needs ``protobuf`` (>= 6.33.5 for
   PySpark 4.3; pinned in requirements.lock) importable by Spark's Python workers.
3. ``latency``: per window of a 1-minute tumbling count (10k users), the micro-batch whose
   rows move the watermark past the window's end (``b``) and the micro-batch whose commit
   holds the window's row (``e``), both written to Parquet: ``e - b`` micro-batches, and the
   seconds from ``b``'s start to ``e``'s end (Spark's listener times both queries), p50 and
   p99 over the windows (those closed by batch 0, the warm-up, left out). Spark's watermark
   only applies from the next micro-batch, so append mode emits a window one batch later.

The latency runs write Parquet on both sides (keyflow's sink names its files by micro-batch;
Spark's query writes each batch with ``foreachBatch`` under ``batch=N``) and check that both
emitted the same windows. Spark's driver (local mode: the whole JVM) gets ``--driver-memory``
4g, on both sides.

Run ``.venv/bin/python -m bench.event_time [--only tumbling|sessions|latency] [--runs 3]``
(about 10 minutes on 2 cores). Default sizes: tumbling 10k users x 6 micro-batches of 500k
rows and 1M users x 4 micro-batches of 500k rows (``--keys``, ``--rows-per-batch``,
``--batches``, one value per key count); sessions 10k users x 5 micro-batches of 100k rows
(``--session-users``, ``--session-rows``, ``--session-batches``, ``--session-active``);
latency 10k users x 8 micro-batches of 200k rows (``--latency-*``).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from typing_extensions import override

from bench.report import emit, emit_best_and_median, progress
from bench.triggers import Triggers
from keyflow import (
    FiredTimers,
    KeyedBatch,
    KeyedState,
    Pipeline,
    ValueState,
    WatermarkStrategy,
    blackhole,
    files,
    parquet,
    tumbling,
)
from keyflow.runtime.session import spark_session
from keyflow.runtime.streaming import BatchMetrics

BENCH = "event_time"
PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
MINUTE_MS = 60_000
LAG_MS = 5_000  # the largest arrival lag of a user: a file is out of order by up to this
BOUND = "10 s"  # the watermark's out-of-orderness, both sides
GAP_MS = 30_000  # session inactivity gap
GAP_US = GAP_MS * 1000
T0_MS = int(np.datetime64("2024-01-01T00:00:30", "ms").astype(np.int64))  # batch b: [T0 + b min, T0 + b+1 min)
UTC_US = pa.timestamp("us", tz="UTC")
SCHEMA = "user string, ts timestamp"
SESSION_SCHEMA = "user string, start timestamp, end timestamp, n bigint"


# --- data -----------------------------------------------------------------------------


def write_events(directory: Path, batches: int, rows: int, users: int, seed: int, active: float = 1.0) -> None:
    """One Parquet file per micro-batch; file ``b`` holds minute ``b`` of event time, its rows
    in arrival order (event time + the user's lag). With ``active`` < 1 only that share of
    the users (drawn anew each minute) has events in a minute."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    names = pa.array([f"u{n}" for n in range(users)], pa.string())
    lag = rng.integers(0, LAG_MS, users)
    for batch in range(batches):
        pool = np.flatnonzero(rng.random(users) < active) if active < 1 else np.arange(users)
        who = pool[rng.integers(0, len(pool), rows)]
        ts = T0_MS + batch * MINUTE_MS + np.sort(rng.integers(0, MINUTE_MS, rows))
        order = np.argsort(ts + lag[who], kind="stable")
        table = pa.table({"user": names.take(who[order]), "ts": pa.array(ts[order], pa.timestamp("ms", tz="UTC"))})
        pq.write_table(table, directory / f"batch-{batch:04d}.parquet")


def batch_max_event_time_us(directory: Path) -> list[int]:
    """The latest event time of each file, in reading order (microseconds)."""
    paths = sorted(directory.glob("batch-*.parquet"))
    return [int(pq.read_table(p, columns=["ts"]).column("ts").cast(pa.int64()).to_numpy().max()) * 1000 for p in paths]


# --- timing ---------------------------------------------------------------------------


TRIGGERS = Triggers()


def session(args: argparse.Namespace) -> SparkSession:
    spark = spark_session(
        {
            "spark.master": f"local[{args.parallelism}]",
            "spark.driver.memory": args.driver_memory,
            "spark.sql.session.timeZone": "UTC",
        },
        app_name="bench",
    )
    TRIGGERS.attach(spark)
    spark.conf.set("spark.sql.shuffle.partitions", str(args.parallelism))
    return spark


def steady_rate(rows: int, batches: list[tuple[float, float, int]]) -> float:
    """Rows per second after the first micro-batch (start-up and compilation): every row of
    the data batches after it over the time of every batch after it (a trailing no-data
    batch included: it emits windows and fires timers)."""
    data = [b for b in batches if b[2] > 0]
    return rows * (len(data) - 1) / sum(b[1] for b in batches[1:])


def emit_rates(metric: str, keyflow: list[float], peer: str, peer_values: list[float]) -> None:
    """Rates: the best of the runs is the highest."""
    runs = len(keyflow)
    emit(BENCH, f"{metric} (best of {runs})", "rows/s", max(keyflow), peer, max(peer_values))
    emit(BENCH, f"{metric} (median of {runs})", "rows/s", statistics.median(keyflow), peer,
         statistics.median(peer_values))  # fmt: skip


# --- keyflow --------------------------------------------------------------------------


def keyflow_pipeline(args: argparse.Namespace) -> Pipeline:
    return Pipeline(
        parallelism=args.parallelism,
        config={
            "spark.master": f"local[{args.parallelism}]",
            "pipeline.progress": "off",
            "execution.checkpointing.interval": "0 s",
        },
    )


def keyflow_source(pipeline: Pipeline, data: Path) -> Any:
    source = files(data, schema=SCHEMA, watch=True, maxFilesPerTrigger="1")
    return pipeline.source(source, watermark=WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND))


def keyflow_run(pipeline: Pipeline, checkpoint: Path) -> tuple[list[BatchMetrics], list[tuple[float, float, int]]]:
    """Run to the end of the input; keyflow's metrics and the listener's times of its query."""
    started = len(TRIGGERS.queries)
    result = pipeline.run(checkpoint=str(checkpoint), available_now=True)
    return result.batches, TRIGGERS.of(TRIGGERS.queries[started], at_least=len(result.batches))


def keyflow_tumbling(args: argparse.Namespace, data: Path, work: Path, sink: Any) -> Any:
    pipeline = keyflow_pipeline(args)
    keyflow_source(pipeline, data).key_by("user").window(tumbling("1 min")).aggregate(n="count(*)").sink(sink)
    return keyflow_run(pipeline, work)


def sessionize(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Each user's open session (state: start, last, n) followed by this call's rows (in time
    order): a row more than GAP after the one before it opens a new session and closes the
    one before; each user's last session stays open with a timer at its end."""
    ts = np.asarray(batch.data.column("ts").cast(pa.int64()).to_numpy(), dtype=np.int64)
    starts, ends = batch.starts, batch.starts + batch.counts - 1
    stored_last = state["last"].get()
    has = np.asarray(stored_last.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    s_start = np.asarray(state["start"].get().cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
    s_last = np.asarray(stored_last.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
    s_n = np.asarray(state["n"].get().fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)

    previous = np.empty_like(ts)
    previous[1:] = ts[:-1]
    previous[starts] = np.where(has, s_last, ts[starts] - GAP_US - 1)  # no open session: a new one
    opens = ts - previous > GAP_US
    boundary = opens.copy()
    boundary[starts] = True
    first = np.flatnonzero(boundary)  # each segment's first row
    last = np.append(first[1:] - 1, len(ts) - 1)
    seg_start, seg_last, seg_n = ts[first], ts[last], (last - first + 1).astype(np.int64)
    key_first = np.searchsorted(first, starts)  # each key's first segment
    key_last = np.searchsorted(first, ends, side="right") - 1  # each key's last segment (stays open)
    goes_on = has & ~opens[starts]  # the first segment continues the stored session
    seg_start[key_first[goes_on]] = np.minimum(s_start[goes_on], seg_start[key_first[goes_on]])
    seg_n[key_first[goes_on]] += s_n[goes_on]
    closed = np.ones(len(first), dtype=bool)
    closed[key_last] = False
    stored_closed = np.flatnonzero(has & opens[starts])

    state.timers.delete_event_time_timer(s_last[has] + GAP_US - 1, key_index=np.flatnonzero(has))
    state.timers.register_event_time_timer(seg_last[key_last] + GAP_US - 1)
    state["start"].update(pa.array(seg_start[key_last], UTC_US))
    state["last"].update(pa.array(seg_last[key_last], UTC_US))
    state["n"].update(pa.array(seg_n[key_last], pa.int64()))

    users = batch.keys.column("user").combine_chunks()
    seg_keys = batch.key_index[first[closed]]
    return session_rows(
        pa.concat_arrays([users.take(pa.array(stored_closed)), users.take(pa.array(seg_keys))]),
        np.concatenate([s_start[stored_closed], seg_start[closed]]),
        np.concatenate([s_last[stored_closed], seg_last[closed]]),
        np.concatenate([s_n[stored_closed], seg_n[closed]]),
    )


def session_timer(timers: FiredTimers, state: KeyedState) -> pa.Table:
    """The watermark passed a session's end: emit it, forget it."""
    start, last, n = (state[name].get() for name in ("start", "last", "n"))
    for name in ("start", "last", "n"):
        state[name].clear()
    return session_rows(
        timers.keys.column("user"),
        np.asarray(start.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64),
        np.asarray(last.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64),
        np.asarray(n.to_numpy(zero_copy_only=False), dtype=np.int64),
    )


def session_rows(users: Any, start: np.ndarray, last: np.ndarray, n: np.ndarray) -> pa.Table:
    if isinstance(users, pa.ChunkedArray):
        users = users.combine_chunks()
    return pa.table(
        {"user": users, "start": pa.array(start, UTC_US), "end": pa.array(last + GAP_US, UTC_US),
         "n": pa.array(n, pa.int64())}
    )  # fmt: skip


SESSION_STATE = {"start": ValueState(UTC_US), "last": ValueState(UTC_US), "n": ValueState("int64")}


def keyflow_sessions(args: argparse.Namespace, data: Path, work: Path, sink: Any) -> Any:
    pipeline = keyflow_pipeline(args)
    keyflow_source(pipeline, data).key_by("user").process(
        sessionize, SESSION_SCHEMA, state=SESSION_STATE, on_timer=session_timer, order_by="ts"
    ).sink(sink)
    return keyflow_run(pipeline, work)


# --- Spark ----------------------------------------------------------------------------


def spark_source(spark: SparkSession, data: Path) -> DataFrame:
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(data))
    return stream.withWatermark("ts", "10 seconds")


def spark_run(frame: DataFrame, work: Path, sink: str, path: Path | None = None) -> list[tuple[float, float, int]]:
    """Run an append-mode query to the end of the input; the listener's times of its batches.
    ``sink``: ``noop``, ``parquet`` (to ``path``) or ``batches`` (Parquet per micro-batch
    under ``path/batch=N``, to tell which batch committed a row)."""
    writer = frame.writeStream.outputMode("append").option("checkpointLocation", str(work))
    if sink == "batches":
        assert path is not None
        writer = writer.foreachBatch(lambda rows, batch: rows.write.parquet(str(path / f"batch={batch}")))
    elif sink == "parquet":
        writer = writer.format("parquet").option("path", str(path))
    else:
        writer = writer.format(sink)
    started = len(TRIGGERS.queries)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    count = max(p["batchId"] for p in query.recentProgress) + 1
    return TRIGGERS.of(TRIGGERS.queries[started], at_least=count)


def spark_tumbling(spark: SparkSession, data: Path, work: Path, provider: str, sink: str = "noop",
                   path: Path | None = None) -> list[tuple[float, float, int]]:  # fmt: skip
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[provider])
    counts = spark_source(spark, data).groupBy(F.window("ts", "1 minute"), "user").count()
    frame = counts.select("user", F.col("window.start").alias("window_start"),
                          F.col("window.end").alias("window_end"), F.col("count").alias("n"))  # fmt: skip
    return spark_run(frame, work, sink, path)


class SparkSessions(StatefulProcessor):
    """The same sessions with ``transformWithStateInPandas``: one open session per user in a
    value state, an event-time timer (milliseconds) at its end."""

    @override
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", "start long, last long, n long")

    @override
    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        ms = [frame["ts"].to_numpy().astype("datetime64[ms]").astype(np.int64) for frame in rows]
        ts = np.sort(np.concatenate(ms))
        if self.session.exists():
            start, last, n = self.session.get() or (0, 0, 0)
            self.handle.deleteTimer(last + GAP_MS)
        else:
            start, last, n = int(ts[0]), int(ts[0]), 0
        # segment 0 continues the open session; a row more than GAP after the one before opens the next
        segment = np.cumsum(np.diff(ts, prepend=last) > GAP_MS)
        count = int(segment[-1]) + 1
        seg_n = np.bincount(segment, minlength=count)
        seg_n[0] += n
        seg_start = np.full(count, np.iinfo(np.int64).max)
        np.minimum.at(seg_start, segment, ts)
        seg_start[0] = min(seg_start[0], start)
        seg_last = np.full(count, np.iinfo(np.int64).min)
        np.maximum.at(seg_last, segment, ts)
        seg_last[0] = max(seg_last[0], last)
        self.session.update((int(seg_start[-1]), int(seg_last[-1]), int(seg_n[-1])))
        self.handle.registerTimer(int(seg_last[-1]) + GAP_MS)
        if count > 1:
            yield spark_session_rows(key[0], seg_start[:-1], seg_last[:-1], seg_n[:-1])

    @override
    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        start, last, n = self.session.get() or (0, 0, 0)  # a timer fires only with a session
        self.session.clear()
        yield spark_session_rows(key[0], np.array([start]), np.array([last]), np.array([n]))

    @override
    def close(self) -> None:
        return None


def spark_session_rows(user: str, start: np.ndarray, last: np.ndarray, n: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {"user": [user] * len(n), "start": pd.to_datetime(start, unit="ms", utc=True),
         "end": pd.to_datetime(last + GAP_MS, unit="ms", utc=True), "n": np.asarray(n, dtype=np.int64)}
    )  # fmt: skip


def spark_sessions(spark: SparkSession, data: Path, work: Path, sink: str = "noop",
                   path: Path | None = None) -> list[tuple[float, float, int]]:  # fmt: skip
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS["rocksdb"])
    frame = (
        spark_source(spark, data)
        .groupBy("user")
        .transformWithStateInPandas(SparkSessions(), SESSION_SCHEMA, "Append", "EventTime")
    )
    return spark_run(frame, work, sink, path)


# --- figures --------------------------------------------------------------------------


def read_parquet_dir(path: Path) -> pd.DataFrame:
    parts = sorted(p for p in path.rglob("*.parquet") if not any(s.startswith(("_", ".")) for s in p.parts))
    frames = [pq.read_table(p).to_pandas() for p in parts]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def normalised(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Rows sorted, timestamps as int64 microseconds (UTC), so both systems' outputs compare."""
    frame = frame[columns].copy()
    for column in columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            values = frame[column]
            if values.dt.tz is None:
                values = values.dt.tz_localize("UTC")
            frame[column] = values.dt.tz_convert("UTC").astype("datetime64[us, UTC]").astype(np.int64)
    frame["n"] = frame["n"].astype(np.int64)
    return frame.sort_values(columns, ignore_index=True)


def warm_up(work: Path, args: argparse.Namespace) -> None:
    """A small run of each system first, so no figure pays the JVM's and workers' warm-up."""
    data = work / "warm-up"
    write_events(data, 3, 50_000, 1_000, seed=0)
    spark = session(args)
    keyflow_tumbling(args, data, work / "kf-warm-up", blackhole())
    for provider in PROVIDERS:
        spark_tumbling(spark, data, work / f"ss-warm-up-{provider}", provider)


def check_tumbling(work: Path, args: argparse.Namespace) -> None:
    """Both systems give the windows pandas gives, on a small input."""
    data = work / "tumbling-check"
    write_events(data, 5, 20_000, 500, seed=11)
    keyflow_tumbling(args, data, work / "kf-tumbling-check", parquet(str(work / "kf-tumbling-check-out")))
    spark = session(args)
    spark_tumbling(spark, data, work / "ss-tumbling-check", "hdfs", "parquet", work / "ss-tumbling-check-out")
    columns = ["user", "window_start", "window_end", "n"]
    got = normalised(read_parquet_dir(work / "kf-tumbling-check-out"), columns)
    peer = normalised(read_parquet_dir(work / "ss-tumbling-check-out"), columns)
    events = read_parquet_dir(data)
    final = max(batch_max_event_time_us(data)) - 10_000_000  # both: a window closes once max - 10 s >= its end
    ts = events["ts"].astype("datetime64[us, UTC]").astype(np.int64)
    start = ts // (MINUTE_MS * 1000) * (MINUTE_MS * 1000)
    reference = events.assign(window_start=start, window_end=start + MINUTE_MS * 1000).groupby(
        ["user", "window_start", "window_end"]).size().rename("n").reset_index()  # fmt: skip
    reference = normalised(reference[reference.window_end <= final], columns)
    pd.testing.assert_frame_equal(got, reference)
    pd.testing.assert_frame_equal(peer, reference)
    progress(f"tumbling check: keyflow and Spark both give pandas' {len(reference)} windows")


def tumbling_figure(work: Path, args: argparse.Namespace, users: int, rows: int, batches: int) -> None:
    data = work / f"tumbling-{users}"
    write_events(data, batches, rows, users, seed=users)
    spark = session(args)
    rates: dict[str, list[float]] = {"keyflow": [], **{provider: [] for provider in PROVIDERS}}
    for run in range(args.runs):
        progress(f"tumbling count, {users:,} users, run {run + 1}/{args.runs}: keyflow")
        _, times = keyflow_tumbling(args, data, work / f"kf-{users}-{run}", blackhole())
        rates["keyflow"].append(steady_rate(rows, times))
        progress(f"  batches {[round(t[1], 2) for t in times]}")
        for provider in PROVIDERS:
            progress(f"tumbling count, {users:,} users, run {run + 1}/{args.runs}: Structured Streaming ({provider})")
            times = spark_tumbling(spark, data, work / f"ss-{users}-{run}-{provider}", provider)
            rates[provider].append(steady_rate(rows, times))
            progress(f"  batches {[round(t[1], 2) for t in times]}")
    faster = max(PROVIDERS, key=lambda p: statistics.median(rates[p]))
    for provider in PROVIDERS:
        emit_rates(
            f"tumbling 1 min count per user, {users} users, {batches} micro-batches x {rows} rows: throughput",
            rates["keyflow"],
            f"Structured Streaming window count, append, {provider} state store"
            + (" (faster provider)" if provider == faster else ""),
            rates[provider],
        )


def reference_sessions(events: pd.DataFrame, final_watermark_us: int) -> pd.DataFrame:
    """pandas: a new session after a pause longer than GAP; finished once its end (last + GAP)
    is at or before the final ``max - bound`` (keyflow: end - 1 us <= max - bound - 1 us)."""
    ordered = events.assign(ts=events["ts"].astype("datetime64[us, UTC]").astype(np.int64))
    ordered = ordered.sort_values(["user", "ts"], kind="stable")
    ordered["session"] = (ordered.groupby("user")["ts"].diff().fillna(GAP_US + 1) > GAP_US).cumsum()
    sessions = ordered.groupby("session").agg(user=("user", "first"), start=("ts", "min"), last=("ts", "max"),
                                              n=("ts", "size"))  # fmt: skip
    sessions["end"] = sessions["last"] + GAP_US
    return sessions[sessions["end"] <= final_watermark_us][["user", "start", "end", "n"]]


def check_sessions(work: Path, args: argparse.Namespace) -> None:
    """keyflow, Spark and pandas give the same finished sessions on a small input; the bench
    stops otherwise (a wrong implementation must not report a speed)."""
    data = work / "sessions-check"
    write_events(data, 6, 3_000, 200, seed=13, active=args.session_active)
    keyflow_sessions(args, data, work / "kf-sessions-check", parquet(str(work / "kf-sessions-check-out")))
    spark = session(args)
    spark_sessions(spark, data, work / "ss-sessions-check", "parquet", work / "ss-sessions-check-out")
    columns = ["user", "start", "end", "n"]
    got = normalised(read_parquet_dir(work / "kf-sessions-check-out"), columns)
    peer = normalised(read_parquet_dir(work / "ss-sessions-check-out"), columns)
    final = max(batch_max_event_time_us(data)) - 10_000_000
    reference = normalised(reference_sessions(read_parquet_dir(data), final), columns)
    pd.testing.assert_frame_equal(got, reference)
    pd.testing.assert_frame_equal(peer, reference)
    progress(f"sessions check: keyflow and Spark both give pandas' {len(reference)} sessions")


def has_protobuf() -> bool:
    try:
        return importlib.util.find_spec("google.protobuf") is not None
    except ModuleNotFoundError:  # no ``google`` package at all
        return False


def sessions_figure(work: Path, args: argparse.Namespace) -> None:
    if not has_protobuf():
        progress("sessions: skipped, transformWithStateInPandas needs protobuf (pip install 'protobuf>=6.33.5,<7')")
        return
    check_sessions(work, args)
    users, rows = args.session_users, args.session_rows
    data = work / "sessions"
    write_events(data, args.session_batches, rows, users, seed=5, active=args.session_active)
    spark = session(args)
    rates: dict[str, list[float]] = {"keyflow": [], "peer": []}
    for run in range(args.runs):
        progress(f"sessions, {users:,} users, run {run + 1}/{args.runs}: keyflow")
        metrics, times = keyflow_sessions(args, data, work / f"kf-sessions-{run}", blackhole())
        rates["keyflow"].append(steady_rate(rows, times))
        emitted = [sum(m.output_rows.values()) for m in metrics]
        progress(f"  batches {[round(t[1], 2) for t in times]}, sessions emitted {emitted}")
        progress(f"sessions, {users:,} users, run {run + 1}/{args.runs}: transformWithStateInPandas")
        times = spark_sessions(spark, data, work / f"ss-sessions-{run}")
        rates["peer"].append(steady_rate(rows, times))
        progress(f"  batches {[round(t[1], 2) for t in times]}")
    emit_rates(
        f"sessions (30 s gap) per user with event-time timers, {users} users ({args.session_active:.0%} active a "
        f"minute), {args.session_batches} micro-batches x {rows} rows: throughput",
        rates["keyflow"],
        "Spark transformWithStateInPandas, event-time timers, rocksdb state store",
        rates["peer"],
    )


def window_latencies(windows: pd.DataFrame, passing: np.ndarray, times: list[tuple[float, float, int]]
                     ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per window (``window_end`` in us, ``batch``: the micro-batch that committed it): the
    micro-batches and seconds from the one whose rows pass its end to its commit."""
    ends = windows["window_end"].to_numpy()
    # the first micro-batch whose rows bring max - 10 s to the window's end
    passed = np.searchsorted(passing, ends, side="left")
    emitted = windows["batch"].to_numpy()
    keep = passed > 0  # windows closed by the first micro-batch pay its start-up: left out
    passed, emitted = passed[keep], emitted[keep]
    if (emitted < passed).any():
        raise AssertionError("a window was committed before the watermark passed its end")
    starts = np.array([t[0] for t in times])
    finishes = np.array([t[0] + t[1] for t in times])
    return (emitted - passed).astype(float), finishes[emitted] - starts[passed]


def latency_figure(work: Path, args: argparse.Namespace) -> None:
    users, rows = args.latency_users, args.latency_rows
    data = work / "latency"
    write_events(data, args.latency_batches, rows, users, seed=3)
    # micro-batch b passes every window end at or before its running max - 10 s
    passing = np.maximum.accumulate(np.array(batch_max_event_time_us(data))) - 10_000_000
    spark = session(args)
    figures: dict[str, dict[str, list[float]]] = {side: {} for side in ("keyflow", "peer")}
    columns = ["user", "window_start", "window_end", "n"]
    for run in range(args.runs):
        progress(f"latency, {users:,} users, run {run + 1}/{args.runs}: keyflow")
        out = work / f"kf-latency-out-{run}"
        metrics, times = keyflow_tumbling(args, data, work / f"kf-latency-{run}", parquet(str(out)))
        assert [m.input_rows for m in metrics] == [rows] * args.latency_batches, "one file per micro-batch"
        parts = []
        for path in sorted(out.glob("part-b*")):
            part = normalised(pq.read_table(path).to_pandas(), columns)
            parts.append(part.assign(batch=int(path.name[6:16])))
        kf_windows = pd.concat(parts, ignore_index=True)
        progress(f"latency, {users:,} users, run {run + 1}/{args.runs}: Structured Streaming (hdfs)")
        out = work / f"ss-latency-out-{run}"
        ss_times = spark_tumbling(spark, data, work / f"ss-latency-{run}", "hdfs", "batches", out)
        parts = [normalised(read_parquet_dir(d), columns).assign(batch=int(d.name.split("=")[1]))
                 for d in out.glob("batch=*") if any(d.glob("*.parquet"))]  # fmt: skip
        ss_windows = pd.concat(parts, ignore_index=True)
        pd.testing.assert_frame_equal(  # the same windows, whichever batch emitted them
            kf_windows[columns].sort_values(columns, ignore_index=True),
            ss_windows[columns].sort_values(columns, ignore_index=True),
        )
        for side, windows, side_times in (("keyflow", kf_windows, times), ("peer", ss_windows, ss_times)):
            batches, seconds = window_latencies(windows, passing, side_times)
            for name, values in (("batches", batches), ("seconds", seconds)):
                for q in (50, 99):
                    figures[side].setdefault(f"{name} p{q}", []).append(float(np.percentile(values, q)))
        progress(f"  keyflow { ({k: round(v[-1], 3) for k, v in figures['keyflow'].items()}) }")
        progress(f"  Spark   { ({k: round(v[-1], 3) for k, v in figures['peer'].items()}) }")
    peer = "Structured Streaming window count, append, hdfs state store"
    what = f"tumbling 1 min count, {users} users, {args.latency_batches} micro-batches x {rows} rows"
    for name, unit in (("batches", "micro-batches"), ("seconds", "s")):
        for q in (50, 99):
            metric = f"{what}: window latency p{q}, watermark passing its end to its commit ({unit})"
            emit_best_and_median(BENCH, metric, unit, figures["keyflow"][f"{name} p{q}"], peer,
                                 figures["peer"][f"{name} p{q}"])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["tumbling", "sessions", "latency"])
    parser.add_argument("--runs", type=int, default=3, help="runs of each system, alternating")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--driver-memory", default="4g", help="Spark's driver (the JVM of local mode) heap")
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 1_000_000], help="users, tumbling")
    parser.add_argument("--rows-per-batch", type=int, nargs="+", default=[500_000, 500_000],
                        help="rows per micro-batch, tumbling: one per --keys value")  # fmt: skip
    parser.add_argument("--batches", type=int, nargs="+", default=[6, 4],
                        help="micro-batches (minutes of event time), tumbling: one per --keys value")  # fmt: skip
    parser.add_argument("--session-users", type=int, default=10_000)
    parser.add_argument("--session-rows", type=int, default=100_000)
    parser.add_argument("--session-batches", type=int, default=5)
    parser.add_argument("--session-active", type=float, default=0.5, help="share of users active in a minute")
    parser.add_argument("--latency-users", type=int, default=10_000)
    parser.add_argument("--latency-rows", type=int, default=200_000)
    parser.add_argument("--latency-batches", type=int, default=8)
    args = parser.parse_args()
    if not len(args.rows_per_batch) == len(args.batches) == len(args.keys):
        parser.error("give one --rows-per-batch and one --batches per --keys value")
    work = Path(tempfile.mkdtemp(prefix="keyflow-bench-event-time-"))
    keep = False
    try:
        progress("warm-up")
        warm_up(work, args)
        if args.only in (None, "tumbling"):
            check_tumbling(work, args)
            for users, rows, batches in zip(args.keys, args.rows_per_batch, args.batches, strict=True):
                tumbling_figure(work, args, users, rows, batches)
        if args.only in (None, "sessions"):
            sessions_figure(work, args)
        if args.only in (None, "latency"):
            latency_figure(work, args)
    except AssertionError:  # a correctness check failed: keep its inputs and outputs to look at
        keep = True
        progress(f"a check failed; its data and outputs are kept in {work}")
        raise
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
