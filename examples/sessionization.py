"""Sessionization on event time, two ways: a process function with timers, and session windows.

A click log (3 splits, keyed by user) is read 400 rows per micro-batch. A session is a user's
clicks with no pause over 5 minutes; it ends 5 minutes after its last click.

- ``by_timers``: ``process`` keeps each user's open session in state, with an event-time timer
  at its end; ``on_timer`` emits it. Timers fire between micro-batches, so a pause inside one
  micro-batch's rows is found by the function (``order_by="ts"``: each user's rows in time
  order), which emits that session at once (each user's clicks arrive in order here).
- ``by_window``: ``window(session("5 min")).aggregate(...)`` emits a session only when the
  watermark passes its end: a click up to 30 s late could still join two sessions.

Both are checked against pandas: ``.venv/bin/python examples/sessionization.py``
"""

from __future__ import annotations

import tempfile

import numpy as np
import pandas as pd
import pyarrow as pa

from keyflow import FiredTimers, KeyedBatch, KeyedState, Log, Pipeline, ValueState, WatermarkStrategy, log, parquet
from keyflow import session as session_window

GAP = pd.Timedelta("5 min")
GAP_US = GAP // pd.Timedelta("1us")
UTC = pa.timestamp("us", tz="UTC")
SESSION = {"start": ValueState(UTC), "last": ValueState(UTC), "clicks": ValueState("int64")}
OUTPUT = "user string, session_start timestamp, session_end timestamp, clicks long"


def click_log(path: str, users: int = 30, clicks_per_user: int = 80, seed: int = 7) -> pd.DataFrame:
    """Bursts of clicks (about a minute apart, now and then a pause of ~20 minutes), appended in
    arrival order: each user's clicks arrive up to 20 s after they happen, so a split's rows
    are out of order by up to 20 s (each user's own rows are not)."""
    rng = np.random.default_rng(seed)
    shape = (users, clicks_per_user)
    pauses = np.where(rng.random(shape) < 0.1, 1200, 60) * rng.exponential(1, shape)
    clicks = pd.DataFrame({"user": np.repeat([f"user-{u}" for u in range(users)], clicks_per_user)})
    clicks["ts"] = pd.Timestamp("2024-01-01", tz="UTC") + pd.to_timedelta(pauses.cumsum(axis=1).ravel().round(), "s")
    arrival = clicks.ts + pd.to_timedelta(np.repeat(rng.integers(0, 20, users), clicks_per_user), "s")
    rows = pa.Table.from_pandas(clicks.iloc[np.argsort(arrival, kind="stable")], preserve_index=False)
    Log.create(path, splits=3, schema=rows.schema).append(rows, key="user")
    return clicks


def micros(timestamps: pa.Array) -> np.ndarray:
    return timestamps.cast(pa.int64()).fill_null(0).to_numpy()


def sessionize(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Each user's open session (from state) and this call's clicks, in time order, cut where a
    pause is longer than GAP: sessions before a cut are over; the last one stays open, with a
    timer at its last microsecond (as Flink's window operator fires at window.maxTimestamp())."""
    had = np.flatnonzero(state["last"].get().is_valid())  # users with an open session
    opened = pd.DataFrame({name: micros(state[name].get())[had] for name in ("start", "last")})
    opened = opened.assign(key=had, clicks=state["clicks"].get().fill_null(0).to_numpy()[had])
    ts = micros(batch.data.column("ts"))
    parts = pd.concat([opened, pd.DataFrame({"key": batch.key_index, "start": ts, "last": ts, "clicks": 1})])
    parts = parts.sort_values(["key", "start"], kind="stable")
    cut = (parts.key != parts.key.shift()) | (parts.start - parts["last"].shift() > GAP_US)
    sessions = parts.groupby(cut.cumsum().to_numpy()).agg(
        key=("key", "first"), start=("start", "min"), last=("last", "max"), clicks=("clicks", "sum")
    )
    latest = ~sessions.key.duplicated(keep="last")
    over, going_on = sessions[~latest], sessions[latest]  # going_on: one per user, in batch.keys order

    state.timers.delete_event_time_timer(opened["last"].to_numpy() + GAP_US - 1, key_index=had)
    state.timers.register_event_time_timer(going_on["last"].to_numpy() + GAP_US - 1)
    for name in SESSION:
        state[name].update(pa.array(going_on[name].to_numpy(), SESSION[name].arrow_type))
    users = batch.keys.column("user").take(over.key.to_numpy())
    return session_rows(users, over.start.to_numpy(), over["last"].to_numpy(), over.clicks.to_numpy())


def on_timer(timers: FiredTimers, state: KeyedState) -> pa.Table:
    """The watermark passed the end of these users' sessions: emit them and forget them."""
    start, last, clicks = micros(state["start"].get()), micros(state["last"].get()), state["clicks"].get()
    for name in SESSION:
        state[name].clear()
    return session_rows(timers.keys.column("user"), start, last, clicks)


def session_rows(users: pa.Array, start: np.ndarray, last: np.ndarray, clicks: pa.Array | np.ndarray) -> pa.Table:
    ends = pa.array(last + GAP_US, UTC)
    return pa.table({"user": users, "session_start": pa.array(start, UTC), "session_end": ends, "clicks": clicks})


def expected_sessions(clicks: pd.DataFrame, watermark: pd.Timestamp, or_followed: bool) -> pd.DataFrame:
    """pandas: a new session after a pause longer than GAP. Emitted once its end - 1 us <= the
    watermark, or (``or_followed``) once a later session of the user began."""
    ordered = clicks.sort_values(["user", "ts"])
    ordered["session"] = (ordered.groupby("user").ts.diff() > GAP).cumsum()
    sessions = ordered.groupby(["user", "session"], as_index=False).agg(
        session_start=("ts", "min"), last=("ts", "max"), clicks=("ts", "size")
    )
    sessions["session_end"] = sessions["last"] + GAP
    emitted = sessions.session_end - pd.Timedelta("1us") <= watermark
    if or_followed:
        emitted |= sessions.user.duplicated(keep="last")
    columns = ["user", "session_start", "session_end", "clicks"]
    return sessions[emitted][columns].sort_values(["user", "session_start"], ignore_index=True)


def read(path: str) -> pd.DataFrame:
    rows = pd.read_parquet(path)  # the committed part files (staging starts with "_": skipped)
    for column in ("session_start", "session_end"):  # Spark writes UTC without the zone
        rows[column] = pd.to_datetime(rows[column], utc=True)
    return rows.sort_values(["user", "session_start"], ignore_index=True)


if __name__ == "__main__":
    base = tempfile.mkdtemp(prefix="keyflow-sessionization-")
    clicks = click_log(f"{base}/clicks")
    pipeline = Pipeline(parallelism=2, config={"execution.checkpointing.interval": "0 s"})
    watermark = WatermarkStrategy.for_bounded_out_of_orderness("ts", "30 s")  # clicks arrive up to 20 s late
    by_user = pipeline.source(log(f"{base}/clicks", rows_per_batch=400), watermark=watermark).key_by("user")
    by_user.process(sessionize, OUTPUT, state=SESSION, on_timer=on_timer, order_by="ts").sink(
        parquet(f"{base}/by_timers")
    )
    by_user.window(session_window("5 min")).aggregate(clicks="count(*)").select(
        "user", "window_start AS session_start", "window_end AS session_end", "clicks"
    ).sink(parquet(f"{base}/by_window"))

    result = pipeline.run(checkpoint=f"{base}/ckpt", available_now=True)
    for batch in result.batches:
        emitted = {sink.rsplit("/", 1)[-1]: rows for sink, rows in batch.output_rows.items()}
        print(f"micro-batch {batch.batch}: {batch.input_rows} clicks, ", end="")
        print(f"watermark {pd.Timestamp(batch.watermark, unit='us')}, sessions {emitted}")

    final = pd.Timestamp(result.batches[-1].watermark, unit="us", tz="UTC")
    by_timers, by_window = read(f"{base}/by_timers"), read(f"{base}/by_window")
    print(by_window.head(6).to_string(index=False))
    pd.testing.assert_frame_equal(by_window, expected_sessions(clicks, final, or_followed=False), check_dtype=False)
    pd.testing.assert_frame_equal(by_timers, expected_sessions(clicks, final, or_followed=True), check_dtype=False)
    print(f"final watermark {final}: {len(by_window)} sessions by windows, {len(by_timers)} by timers, both as pandas")
    print(f"says (by timers also those a later click ended before the watermark passed); output under {base}")
