"""Event time on a real local Spark: watermarks, timers and windows, batch and streaming,
compared with pandas references computed from event-time semantics alone."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keyflow import Log, Pipeline, StateTtlConfig, ValueState, WatermarkStrategy, files, log, parquet, tumbling
from keyflow.errors import PlanError
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.inspect import describe_checkpoint
from tests.event_time import (
    BASE,
    TIMED,
    append_timed,
    assert_event_time_output,
    event_time_sinks,
    normalized,
    timed_events,
)
from tests.streams import config, read_output

pytestmark = pytest.mark.jvm  # every test here runs Spark

STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness("ts", "30 s")


def test_bounded_input_fires_every_window_and_timer(spark, tmp_path: Path) -> None:
    events = timed_events(3_000, 40, start=0, seed=11, seconds=3 * 3600)
    pq.write_table(pa.Table.from_pandas(events, schema=TIMED, preserve_index=False), tmp_path / "events.parquet")
    pipeline = Pipeline(config=config(2))
    source = pipeline.source(files(tmp_path / "events.parquet"), watermark=STRATEGY)
    event_time_sinks(source, tmp_path / "out", window_rows=True)
    pipeline.run()
    assert_event_time_output(
        tmp_path / "out", events, watermark=None, window_rows=True
    )  # the end of input fires everything


def test_stream_over_10_micro_batches_with_restart_and_live_rescale(spark, tmp_path: Path) -> None:
    """Windows, sessions and timers open across micro-batches, a restart at another parallelism
    and a live rescale; the output equals the reference cut at the final watermark."""
    first = timed_events(2_400, 40, start=0, seed=12, seconds=2_400)
    append_timed(tmp_path / "log", first)

    def pipeline(parallelism: int) -> Pipeline:
        built = Pipeline(config=config(parallelism))
        source = built.source(log(str(tmp_path / "log"), rows_per_batch=400), watermark=STRATEGY)
        event_time_sinks(source, tmp_path / "out", tumbling_windows=False, window_rows=True)
        return built

    result = pipeline(2).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 6
    watermarks = [batch.watermark for batch in result.batches]
    assert None not in watermarks
    assert watermarks == sorted(watermarks)
    manifest = Checkpoint(str(tmp_path / "ckpt")).manifests.latest()
    assert manifest is not None
    assert [w["watermark"] for w in manifest.watermarks.values()] == [watermarks[-1]]  # committed with the state

    second = timed_events(1_600, 40, start=2_400, seed=13, seconds=1_600)
    append_timed(tmp_path / "log", second)
    rescaled_at: list[int] = []

    def rescale_once(metrics) -> None:  # type: ignore[no-untyped-def]
        if not rescaled_at and metrics.parallelism == 1:
            rescaled_at.append(metrics.batch)
            job.rescale(3)  # live, while windows, sessions and timers are open

    job = pipeline(1).start(checkpoint=str(tmp_path / "ckpt"), on_batch=rescale_once)
    try:
        job.process_all_available()
    finally:
        job.stop()
    batches = job.result.batches
    assert len(result.batches) + len(batches) >= 10
    assert {b.parallelism for b in batches} == {1, 3}
    everything = pd.concat([first, second], ignore_index=True)
    watermark = batches[-1].watermark
    assert_event_time_output(tmp_path / "out", everything, watermark, window_rows=True, tumbling_windows=False)


def test_late_rows_update_within_lateness_and_go_to_the_late_rows_sink(spark, tmp_path: Path) -> None:
    def rows(*spec: tuple[str, str | None]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "user": [user for user, _ in spec],
                "ts": [None if at is None else BASE + pd.Timedelta(at) for _, at in spec],
                "amount": [1] * len(spec),
                "seq": range(len(spec)),
            }
        )

    # Watermark after the first batch: 00:05:00 - 30 s - 1 us; windows [0, 1) and [3, 4) min fire.
    append_timed(tmp_path / "log", rows(("a", "10s"), ("a", "3min 10s"), ("a", "5min")), splits=1)

    def run() -> None:
        pipeline = Pipeline(config=config(2))
        source = pipeline.source(log(str(tmp_path / "log")), watermark=STRATEGY)
        source.key_by("user").window(tumbling("1 min"), allowed_lateness="1 min", late_rows=parquet(tmp_path / "late")
                                     ).aggregate(n="count(*)").sink(parquet(tmp_path / "out"))  # fmt: skip
        pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)

    run()
    # [3, 4) min is still within its lateness: updated; [0, 1) is not: late; a null time has no window.
    append_timed(tmp_path / "log", rows(("a", "3min 50s"), ("a", "20s"), ("a", None), ("a", "6min")))
    run()
    out = normalized(read_output(tmp_path / "out"), ["window_start", "is_update"])
    assert [(str(w.time()), n, u) for w, n, u in zip(out.window_start, out.n, out.is_update, strict=True)] == [
        ("00:00:00", 1, False),
        ("00:03:00", 1, False),
        ("00:03:00", 2, True),
    ]
    late = read_output(tmp_path / "late").sort_values("reason").reset_index(drop=True)
    assert late.ts.isna().tolist() == [True, False]
    assert late.reason[0] == "event time 'ts' is null or not a timestamp"
    assert late.reason[1].startswith("late: its last window ends at 2024-01-01 00:01:00")
    assert late.ts[1] == pd.Timestamp("2024-01-01 00:00:20")  # the row itself, whole (Spark's sinks write UTC)


def count_per_user(batch, state):  # type: ignore[no-untyped-def]
    counts = batch.last_per_key(batch.running_sum(batch.counts[batch.key_index] * 0 + 1, state["n"].get()))
    state["n"].update(pa.array(counts, pa.int64()))
    return pa.table({"user": batch.keys.column("user"), "n": pa.array(counts, pa.int64())})


def test_state_ttl_expires_values_and_compaction_shrinks_the_state(spark, tmp_path: Path) -> None:
    """Counts per user kept 1 s (processing time): after a pause a user counts from 1 again, and
    a compaction (every delta here) keeps only the keys written since."""
    events = timed_events(300, 30, start=0, seed=14, seconds=60)
    append_timed(tmp_path / "log", events, splits=2)

    def run() -> list[dict[str, object]]:
        pipeline = Pipeline(config=config(2, **{"state.compaction.max-deltas": 1}))
        state = {"n": ValueState("int64", ttl=StateTtlConfig("1 s"))}
        counts = (
            pipeline.source(log(str(tmp_path / "log")))
            .key_by("user")
            .process(count_per_user, "user string, n bigint", state=state, name="counts")
        )
        counts.sink(parquet(tmp_path / "out"))
        pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
        return describe_checkpoint(Checkpoint(str(tmp_path / "ckpt")))["operators"]

    assert run()[0]["keys_stored"] == 30
    time.sleep(1.5)
    again = timed_events(20, 2, start=60, seed=15, seconds=10)
    append_timed(tmp_path / "log", again)
    assert run()[0]["keys_stored"] == 2  # the other 28 expired and were dropped
    out = read_output(tmp_path / "out")
    for user, count in again.user.value_counts().items():
        before = int((events.user == user).sum())
        assert count in set(out.n[out.user == user])  # counted from 1 again: the old count expired
        assert before + count not in set(out.n[out.user == user])


def test_an_idle_split_stops_holding_the_watermark_after_the_idleness_timeout(spark, tmp_path: Path) -> None:
    Log.create(tmp_path / "log", 2, TIMED)
    early = timed_events(40, 4, start=0, seed=16, seconds=60)
    for split in (0, 1):
        Log(tmp_path / "log").append(pa.Table.from_pandas(early, schema=TIMED, preserve_index=False), split=split)
    pipeline = Pipeline(config=config(1))
    source = pipeline.source(log(str(tmp_path / "log")), watermark=STRATEGY.with_idleness("1 s"))
    source.key_by("user").window(tumbling("1 min")).aggregate(n="count(*)").sink(parquet(tmp_path / "out"))
    job = pipeline.start(checkpoint=str(tmp_path / "ckpt"))
    try:
        job.process_all_available()
        assert job.last_batch is not None
        assert job.last_batch.watermark == int(early.ts.max().value // 1000) - 30_000_001
        time.sleep(1.2)  # split 1 gets no rows for longer than the idleness timeout
        late = timed_events(10, 4, start=600, seed=17, seconds=30)
        Log(tmp_path / "log").append(pa.Table.from_pandas(late, schema=TIMED, preserve_index=False), split=0)
        job.process_all_available()
        assert job.last_batch.watermark == int(late.ts.max().value // 1000) - 30_000_001  # not held by split 1
    finally:
        job.stop()
    marks = describe_checkpoint(Checkpoint(str(tmp_path / "ckpt")))["watermarks"]
    assert [m["watermark"] for m in marks] == [(late.ts.max() - pd.Timedelta(microseconds=30_000_001)).isoformat()]


def test_an_event_time_column_spark_finds_wrong_at_start_is_a_plan_error(spark, tmp_path: Path) -> None:
    """A source that tells its columns only to Spark (files, which may gain partition columns):
    the watermark's column missing, or a timestamp without time zone, stops the run at start,
    naming the column and the fix (a declared ntz column is a plan error: test_event_time_logic.py)."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"user": ["a"], "ts": pa.array([0], pa.timestamp("us"))}), tmp_path / "in" / "a.parquet")
    cases = {
        "user string, at timestamp": r"event-time column 'ts' is not among its columns \['user', 'at'\]; name a",
        None: r"'ts' is a timestamp without time zone \(timestamp_ntz\).*tz='UTC'",  # Parquet's, as Spark reads it
    }
    for number, (schema, message) in enumerate(cases.items()):
        pipeline = Pipeline(config=config(1))
        source = files(tmp_path / "in", schema=schema, watch=True)
        pipeline.source(source, watermark=WatermarkStrategy.for_monotonous_timestamps("ts")).sink(
            parquet(tmp_path / "o")
        )
        with pytest.raises(PlanError, match=message):
            pipeline.run(checkpoint=str(tmp_path / f"ckpt-{number}"), available_now=True)
