"""Joins bounded by event time, batch and streaming: interval joins (rows of equal keys whose
event times are close) and window joins (rows of equal keys in the same window). Rows leave
the state once the watermark passes the last time they could match (the state shrinks); an
outer join emits a row that never matched, padded, when it leaves. The reference is DuckDB's
join of the same rows with the same condition."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keyflow import Log, Pipeline, WatermarkStrategy, files, log, parquet, session, sliding, tumbling
from keyflow.errors import PlanError
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.inspect import describe_checkpoint
from tests.event_time import BASE, TIMED, timed_events
from tests.streams import append, config, write_files

CLICKS = pa.schema([("uid", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("click", pa.int64())])
STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness("ts", "30 s")
BETWEEN = ("-20 s", "40 s")  # a click from 20 s before an event to 40 s after it
HOW = ("inner", "left", "right", "full")
COLUMNS = ["user", "ts", "amount", "seq", "click_ts", "click"]
WINDOWS = {"tumbling": tumbling("5 min"), "sliding": sliding("10 min", "5 min")}
WINDOW_JOINS = (("tumbling", "inner"), ("tumbling", "full"), ("sliding", "left"))  # (window, how)


def clicks(rows: int, users: int, start: int, seed: int, seconds: int) -> pd.DataFrame:
    events = timed_events(rows, users, start, seed, seconds)
    return pd.DataFrame({"uid": events.user, "ts": events.ts, "click": events.seq + 10_000_000})


def expected(left: pd.DataFrame, right: pd.DataFrame, how: str) -> pd.DataFrame:
    """DuckDB's join with the same time condition (keys named as the left input's)."""
    kind = {"inner": "INNER", "left": "LEFT", "right": "RIGHT", "full": "FULL OUTER"}[how]
    con = duckdb.connect()
    con.register("l", left)
    con.register("r", right.rename(columns={"ts": "click_ts"}))
    joined = con.execute(
        f"SELECT COALESCE(l.user, r.uid) AS user, l.ts, l.amount, l.seq, r.click_ts, r.click FROM l {kind} JOIN r "
        "ON l.user = r.uid AND r.click_ts BETWEEN l.ts - INTERVAL 20 SECOND AND l.ts + INTERVAL 40 SECOND"
    ).df()
    return tidy(joined)


def expected_windows(left: pd.DataFrame, right: pd.DataFrame, window: str, how: str) -> pd.DataFrame:
    """DuckDB's join of both inputs' rows per 5-minute window (sliding: 10 minutes every 5)."""
    kind = {"inner": "INNER", "left": "LEFT", "right": "RIGHT", "full": "FULL OUTER"}[how]
    con = duckdb.connect()
    con.register("l", windowed(left, window))
    con.register("r", windowed(right.rename(columns={"ts": "click_ts"}), window, "click_ts"))
    joined = con.execute(
        "SELECT COALESCE(l.user, r.uid) AS user, COALESCE(l.window_start, r.window_start) AS window_start, "
        f"l.ts, l.amount, l.seq, r.click_ts, r.click FROM l {kind} JOIN r "
        "ON l.user = r.uid AND l.window_start = r.window_start"
    ).df()
    joined["window_end"] = joined.window_start + pd.Timedelta(WINDOW_SIZE[window])
    return tidy(joined, ["window_start", "window_end"])


WINDOW_SIZE = {"tumbling": "5 min", "sliding": "10 min"}


def windowed(frame: pd.DataFrame, window: str, column: str = "ts") -> pd.DataFrame:
    """Each row once per window it is in (windows start at multiples of 5 minutes)."""
    start = frame[column].dt.floor("5min")
    copies = [frame.assign(window_start=start)]
    if window == "sliding":
        copies.append(frame.assign(window_start=start - pd.Timedelta("5 min")))
    return pd.concat(copies)


def tidy(frame: pd.DataFrame, window: list[str] | None = None) -> pd.DataFrame:
    frame = frame[COLUMNS[:1] + (window or []) + COLUMNS[1:]].astype(
        {"amount": "Int64", "seq": "Int64", "click": "Int64"}
    )
    for column in ("ts", "click_ts", *(window or [])):
        frame[column] = pd.to_datetime(frame[column], utc=True).astype("datetime64[us, UTC]")
    return frame.sort_values(["user", *(window or []), "seq", "click"]).reset_index(drop=True)


def output(path: Path, window: list[str] | None = None) -> pd.DataFrame:
    found = sorted(p for p in path.glob("part-*") if p.is_file())
    if not found:
        return tidy(pd.DataFrame({c: [] for c in COLUMNS + (window or [])}), window)
    rows = pa.concat_tables([pq.read_table(f) for f in found])
    assert "op" not in rows.column_names  # append-only: a padded row is emitted once, when it leaves
    return tidy(rows.to_pandas(), window)


def time_joins(
    p: Pipeline, left: object, right: object, out: Path, hows: tuple[str, ...], windows: tuple[tuple[str, str], ...]
) -> None:
    events = p.source(left, uid="events", watermark=STRATEGY)
    renamed = p.source(right, uid="clicks", watermark=STRATEGY).select("uid", "ts AS click_ts", "click")
    for how in hows:
        joined = events.interval_join(renamed, on=[("user", "uid")], between=BETWEEN, how=how)
        joined.uid(f"{how}-join").sink(parquet(out / how), uid=f"{how}-out")
    for window, how in windows:
        joined = events.window_join(renamed, on=[("user", "uid")], window=WINDOWS[window], how=how)
        joined.uid(f"{window}-{how}").sink(parquet(out / f"{window}-{how}"), uid=f"{window}-{how}-out")


@pytest.mark.jvm
def test_batch_interval_and_window_joins_equal_duckdb(tmp_path: Path) -> None:
    left = timed_events(400, 30, start=0, seed=1, seconds=900)
    right = clicks(400, 30, start=0, seed=2, seconds=900).sample(frac=1, random_state=3)  # any order
    write_files(tmp_path / "events", left, TIMED)
    write_files(tmp_path / "clicks", right, CLICKS)
    p = Pipeline(config=config(3))
    time_joins(p, files(str(tmp_path / "events")), files(str(tmp_path / "clicks")), tmp_path / "out", HOW, WINDOW_JOINS)
    p.run()
    for how in HOW:
        got, want = output(tmp_path / "out" / how), expected(left, right, how)
        pd.testing.assert_frame_equal(got, want, obj=how)
    assert 0 < len(expected(left, right, "inner")) < len(expected(left, right, "full"))  # both kinds of rows
    for window, how in WINDOW_JOINS:
        got = output(tmp_path / "out" / f"{window}-{how}", ["window_start", "window_end"])
        pd.testing.assert_frame_equal(got, expected_windows(left, right, window, how), obj=f"{window} {how}")


@pytest.mark.jvm
def test_streaming_time_joins_drop_rows_the_watermark_passed(tmp_path: Path) -> None:
    """Each round's rows are 10 minutes of event time, out of order within the watermark's
    bound; a live rescale and a restart at another parallelism come while rows wait in state.
    The inner interval join equals DuckDB's after every round; the full joins, whose padded
    rows wait until they leave, after a last round a day later than the rest (in every split,
    so the watermark moves); then only that round's keys are left in the state."""
    out, hows, windows = tmp_path / "out", ("inner", "full"), (("tumbling", "full"),)
    Log.create(tmp_path / "events", 3, TIMED)
    Log.create(tmp_path / "clicks", 3, CLICKS)
    extra = {"state.compaction.max-deltas": 1}
    p = Pipeline(config=config(2, **extra))
    time_joins(p, log(str(tmp_path / "events")), log(str(tmp_path / "clicks")), out, hows, windows)
    late_users, day = [f"z{n}" for n in range(12)], [BASE + pd.Timedelta("1 day")] * 12  # in every split
    flush = (
        pd.DataFrame({"user": late_users, "ts": day, "amount": 1, "seq": -np.arange(1, 13)}),
        pd.DataFrame({"uid": late_users, "ts": day, "click": -np.arange(1, 13)}),
    )
    rounds = [(timed_events(150, 20, 600 * n, 10 + n, 600), clicks(150, 20, 600 * n, 20 + n, 600)) for n in range(3)]
    seen_left, seen_right, stored = [], [], []
    job = None
    try:
        for number, (left, right) in enumerate([*rounds, flush]):
            if number == 2:  # a restart at parallelism 1 from the checkpoint
                job.stop()
                p = Pipeline(config=config(1, **extra))
                time_joins(p, log(str(tmp_path / "events")), log(str(tmp_path / "clicks")), out, hows, windows)
                job = None
            append(tmp_path / "events", left, schema=TIMED, key="user")
            append(tmp_path / "clicks", right, schema=CLICKS, key="uid")
            seen_left.append(left)
            seen_right.append(right)
            job = job or p.start(checkpoint=str(tmp_path / "ckpt"))
            if number == 1:
                job.rescale(3)
            job.process_all_available()
            all_left, all_right = pd.concat(seen_left), pd.concat(seen_right)
            got = output(out / "inner")
            pd.testing.assert_frame_equal(got, expected(all_left, all_right, "inner"), obj=f"inner after {number}")
            operators = describe_checkpoint(Checkpoint(str(tmp_path / "ckpt")))["operators"]
            stored.append({o["uid"]: o["keys_stored"] for o in operators})
    finally:
        if job is not None:
            job.stop()
    pd.testing.assert_frame_equal(output(out / "full"), expected(all_left, all_right, "full"), obj="full")
    got = output(out / "tumbling-full", ["window_start", "window_end"])
    pd.testing.assert_frame_equal(got, expected_windows(all_left, all_right, "tumbling", "full"), obj="window")
    assert all(stored[0][uid] >= 10 for uid in ("inner-join", "full-join", "tumbling-full")), stored
    assert stored[-1] == {"inner-join": 12, "full-join": 12, "tumbling-full": 12}, stored  # the last round's only


def test_interval_join_mistakes_are_plan_errors(tmp_path: Path) -> None:
    Log.create(tmp_path / "e", 2, TIMED)
    Log.create(tmp_path / "c", 2, CLICKS)
    p = Pipeline()
    events = p.source(log(str(tmp_path / "e")), name="events", watermark=STRATEGY)
    timed = p.source(log(str(tmp_path / "c")), name="clicks", watermark=STRATEGY)
    untimed = p.source(log(str(tmp_path / "c")), name="plain clicks")
    clicks_ = timed.select("uid", "ts AS click_ts", "click")
    with pytest.raises(
        PlanError,
        match=r"the right stream \('select', from source 'plain clicks'\) has no event time, which the join",
    ):
        events.interval_join(untimed.select("uid", "click"), on=[("user", "uid")], between=BETWEEN)
    with pytest.raises(
        PlanError,
        match=r"the event-time column 'ts' of the right stream \('select', from source 'clicks'\) \(the source's "
        r"watermark column\) is not among the columns reaching the join \['uid', 'click'\]",
    ):
        events.interval_join(timed.select("uid", "click"), on=[("user", "uid")], between=BETWEEN)
    with pytest.raises(PlanError, match=r"between=\(10 s, -5 s\) is empty.*swap them: between=\('-5 s', '10 s'\)"):
        events.interval_join(clicks_, on=[("user", "uid")], between=("10 s", "-5 s"))
    with pytest.raises(PlanError, match=r"give \(lower, upper\)"):
        events.interval_join(clicks_, on=[("user", "uid")], between="5 s")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"between lower='-5 x' is not a duration.*\(before the time: '-5 s'\)"):
        events.interval_join(clicks_, on=[("user", "uid")], between=("-5 x", "5 s"))
    with pytest.raises(PlanError, match=r"both streams have column\(s\) \['ts'\] besides the keys"):
        events.interval_join(timed, on=[("user", "uid")], between=BETWEEN)
    with pytest.raises(PlanError, match="join how='outer' is not a join type"):
        events.interval_join(clicks_, on=[("user", "uid")], between=BETWEEN, how="outer")
    with pytest.raises(PlanError, match=r"window=.*is not a window a join can use; give tumbling\('1 min'\)"):
        events.window_join(clicks_, on=[("user", "uid")], window=session("1 min"))  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"inner window join: the left stream \('plain clicks'\) has no event time"):
        untimed.window_join(clicks_, on="uid", window=tumbling("1 min"))
    with pytest.raises(PlanError, match=r"an input has column\(s\) \['window_start'\], which the join adds"):
        events.window_join(
            clicks_.select("*", "click_ts AS window_start"), on=[("user", "uid")], window=tumbling("1 min")
        )
    odd = p.source(log(str(tmp_path / "c")), name="clicks{eu}", watermark=STRATEGY).select("uid", "click")
    with pytest.raises(PlanError, match=r"from source 'clicks\{eu\}'\) \(the source's watermark column\) is not"):
        events.interval_join(odd, on=[("user", "uid")], between=BETWEEN)
    events.interval_join(clicks_, on=[("user", "uid")], between=("-5 s", "0 s")).sink(parquet(tmp_path / "out"))
    described = str(p.plan())
    assert "inner interval join" in described, described
    assert "click_ts - ts in [-5000000, 0] us" in described, described
