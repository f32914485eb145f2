"""Event-time test helpers: timestamped events in a log, keyflow's event-time operators, and
pandas references computed from event-time semantics alone (windows, sessions, inactivity)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from keyflow import KeyedBatch, KeyedState, Stream, ValueState, parquet, session, tumbling
from tests.streams import append, read_output

TIMED = pa.schema(
    [("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("amount", pa.int64()), ("seq", pa.int64())]
)
UTC = pa.timestamp("us", tz="UTC")
BASE = pd.Timestamp("2024-01-01", tz="UTC")
TUMBLE, GAP = "10 min", pd.Timedelta("5 min")
GAP_US = int(GAP / pd.Timedelta(microseconds=1))
DISORDER = 20  # seconds a row may trail the newest row of its split; the strategy's bound is 30 s


def timed_events(rows: int, users: int, start: int, seed: int, seconds: int) -> pd.DataFrame:
    """Events in arrival order (``seq``) from BASE + ``start`` seconds over ``seconds``; each
    user's event time trails arrival by a lag of its own (up to DISORDER s), so the rows of a
    split are out of order while each user's are not."""
    rng = np.random.default_rng(seed)
    arrival = start + np.sort(rng.integers(0, seconds, rows))
    user = rng.integers(0, users, rows)
    lag = np.random.default_rng(0).integers(0, DISORDER, users)
    return pd.DataFrame(
        {
            "user": [f"u{n}" for n in user],
            "ts": BASE + pd.to_timedelta(arrival - lag[user], unit="s"),
            "amount": rng.integers(1, 100, rows),
            "seq": np.arange(start * 1000, start * 1000 + rows, dtype=np.int64),
        }
    )


def append_timed(log_path: Path, frame: pd.DataFrame, splits: int = 4) -> None:
    append(log_path, frame, splits, TIMED)


def inactivity(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """An alert at ``last row + GAP`` when a user goes quiet: gaps inside the micro-batch are
    found here (timers fire between micro-batches), the last one by an event-time timer."""
    ts = batch.data.column("ts").cast(UTC).cast(pa.int64()).to_numpy()
    before = state["last"].get().cast(pa.int64()).to_numpy(zero_copy_only=False).astype("float64")
    previous = np.empty(len(ts))
    previous[1:] = ts[:-1]
    previous[batch.starts] = before  # NaN: no row before
    gap = ~np.isnan(previous) & (ts - np.nan_to_num(previous) > GAP_US)
    alerts = pa.table(
        {
            "user": batch.data.column("user").filter(pa.array(gap)),
            "alert_at": pa.array((previous[gap] + GAP_US).astype(np.int64), UTC),
        }
    )
    known = ~np.isnan(before)
    if known.any():
        state.timers.delete_event_time_timer((before[known] + GAP_US).astype(np.int64), key_index=np.flatnonzero(known))
    last = batch.last_per_key(ts)
    state.timers.register_event_time_timer(last + GAP_US)
    state["last"].update(pa.array(last, UTC))
    return alerts


def on_inactive(timers, state: KeyedState) -> pa.Table:  # type: ignore[no-untyped-def]
    state["last"].clear()
    return pa.table({"user": timers.keys.column("user"), "alert_at": timers.timestamps})


def window_totals(windows: KeyedBatch) -> pa.Table:
    """A window function over all rows of each window: its row count and total amount."""
    amounts = windows.data.column("amount").to_numpy()
    totals = np.bincount(windows.key_index, weights=amounts, minlength=windows.num_keys).astype(np.int64)
    return windows.keys.append_column("n", pa.array(windows.counts)).append_column("total", pa.array(totals))


def event_time_sinks(stream: Stream, out: Path, window_rows: bool = False, tumbling_windows: bool = True) -> None:
    """The event-time operators on ``stream``, each to its own parquet sink under ``out``:
    tumbling windows (unless ``tumbling_windows`` is False), sessions and inactivity timers;
    with ``window_rows`` also the tumbling windows' totals from all their rows (``rows``)."""
    if window_rows:
        stream.key_by("user").window(tumbling(TUMBLE)).process(
            window_totals, "user string, window_start timestamp, window_end timestamp, n bigint, total bigint"
        ).uid("window-rows").sink(parquet(out / "rows"), uid="rows-out")
    if tumbling_windows:
        tumbled = stream.key_by("user").window(tumbling(TUMBLE)).aggregate(n="count(*)", total="sum(amount)")
        tumbled.uid("tumbling").sink(parquet(out / "tumbling"), uid="tumbling-out")
    stream.key_by("user").window(session("5 min")).aggregate(n="count(*)", top="max(amount)").uid("sessions").sink(
        parquet(out / "sessions"), uid="sessions-out"
    )
    stream.key_by("user").process(
        inactivity,
        "user string, alert_at timestamp",
        state={"last": ValueState(UTC)},
        on_timer=on_inactive,
        order_by="ts",
    ).uid("inactivity").sink(parquet(out / "alerts"), uid="alerts-out")


def _fired(frame: pd.DataFrame, end: pd.Series, watermark: int | None) -> pd.DataFrame:
    """Rows whose window ends at or before the watermark + 1 us (all of them: no watermark bound)."""
    if watermark is None:
        return frame
    return frame[end.astype("int64") // 1000 - 1 <= watermark]


def expected_tumbling(events: pd.DataFrame, watermark: int | None = None) -> pd.DataFrame:
    start = events.ts.dt.floor(TUMBLE)
    grouped = events.assign(window_start=start).groupby(["user", "window_start"])
    windows = grouped.agg(n=("amount", "size"), total=("amount", "sum")).reset_index()
    windows = _fired(windows, windows.window_start + pd.Timedelta(TUMBLE), watermark)
    return windows.sort_values(["user", "window_start"]).reset_index(drop=True)


def expected_sessions(events: pd.DataFrame, watermark: int | None = None) -> pd.DataFrame:
    ordered = events.sort_values(["user", "ts"])
    step = ordered.groupby("user")["ts"].diff()
    ordered = ordered.assign(session=(step.isna() | (step > GAP)).cumsum())
    sessions = ordered.groupby(["user", "session"]).agg(
        window_start=("ts", "min"), last=("ts", "max"), n=("amount", "size"), top=("amount", "max")
    )
    sessions = sessions.reset_index().assign(window_end=lambda s: s["last"] + GAP)
    sessions = _fired(sessions, sessions.window_end, watermark)
    sessions = sessions[["user", "window_start", "window_end", "n", "top"]]
    return sessions.sort_values(["user", "window_start"]).reset_index(drop=True)


def expected_alerts(events: pd.DataFrame, watermark: int | None = None) -> pd.DataFrame:
    ordered = events.sort_values(["user", "ts"])
    following = ordered.groupby("user")["ts"].shift(-1)
    due = ordered.ts + GAP
    alerts = ordered[(following > due) | following.isna()].assign(alert_at=due)
    alerts = _fired(alerts, alerts.alert_at + pd.Timedelta(microseconds=1), watermark)
    return alerts[["user", "alert_at"]].sort_values(["user", "alert_at"]).reset_index(drop=True)


def assert_event_time_output(
    out: Path, events: pd.DataFrame, watermark: int | None, window_rows: bool = False, tumbling_windows: bool = True
) -> None:
    """The outputs of :func:`event_time_sinks` equal the references cut at ``watermark``."""
    expected = normalized(expected_tumbling(events, watermark), ["user", "window_start"])
    for windows in ("tumbling",) * tumbling_windows + ("rows",) * window_rows:
        tumbling_rows = normalized(read_output(out / windows), ["user", "window_start"])
        assert (tumbling_rows.window_end - tumbling_rows.window_start == pd.Timedelta("10 min")).all()
        pd.testing.assert_frame_equal(tumbling_rows[["user", "window_start", "n", "total"]], expected,
                                      check_dtype=False)  # fmt: skip
    sessions = normalized(read_output(out / "sessions"), ["user", "window_start"])
    pd.testing.assert_frame_equal(sessions, normalized(expected_sessions(events, watermark), ["user", "window_start"]),
                                  check_dtype=False)  # fmt: skip
    alerts = normalized(read_output(out / "alerts"), ["user", "alert_at"])
    pd.testing.assert_frame_equal(alerts, normalized(expected_alerts(events, watermark), ["user", "alert_at"]),
                                  check_dtype=False)  # fmt: skip


def normalized(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Output rows in a stable order with timestamps in UTC, for comparing with a reference."""
    frame = frame.copy()
    for column in frame.columns:
        if isinstance(frame[column].dtype, pd.DatetimeTZDtype):
            frame[column] = frame[column].dt.tz_convert("UTC").dt.as_unit("ns")
    return frame.sort_values(by).reset_index(drop=True)
