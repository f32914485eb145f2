"""Window table functions beyond the Nexmark queries: CUMULATE, offsets of TUMBLE, HOP and
CUMULATE, and a Top-N per window, as Flink defines them; each window's aggregate equals plain
Python assigning the same rows to the same windows, bounded and streamed over micro-batches."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from keyflow import Pipeline
from keyflow.state.checkpoint import Checkpoint
from tests.pipelines import TEST_SPARK
from tests.streams import read_output, split, write_parts

MINUTE = 60_000_000
START = pd.Timestamp("2026-05-04 10:00:00")
WINDOWS = {  # sink -> (window table function, its windows as Python assigns them: kind, step, size, offset)
    "cumulate": ("CUMULATE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '2' MINUTE, INTERVAL '10' MINUTE)",
                 ("cumulate", 2, 10, 0)),
    "cumulate_offset": ("CUMULATE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '1' MINUTE, INTERVAL '4' MINUTE, "
                        "INTERVAL '-90' SECOND)", ("cumulate", 1, 4, -1.5)),
    "tumble_offset": ("TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '10' MINUTE, INTERVAL '3' MINUTE)",
                      ("tumble", 10, 10, 3)),
    "hop_offset": ("HOP(TABLE clicks, DESCRIPTOR(ts), INTERVAL '2' MINUTE, INTERVAL '5' MINUTE, INTERVAL '-1' MINUTE)",
                   ("hop", 2, 5, -1)),
}  # fmt: skip


def windows_of(micros: int, kind: str, step: float, size: float, offset: float) -> list[tuple[int, int]]:
    """Flink's windows of a row at ``micros`` (steps, sizes and offsets in minutes)."""
    step_us, size_us, offset_us = int(step * MINUTE), int(size * MINUTE), int(offset * MINUTE)
    if kind == "tumble":
        start = micros - (micros - offset_us) % size_us
        return [(start, start + size_us)]
    if kind == "hop":
        last = micros - (micros - offset_us) % step_us
        return [(s, s + size_us) for s in range(last, micros - size_us, -step_us)]
    start = micros - (micros - offset_us) % size_us
    first = (micros - start) // step_us + 1
    return [(start, start + k * step_us) for k in range(first, size_us // step_us + 1)]


def expected(clicks: pd.DataFrame, window: tuple[str, float, float, float], before: int | None = None) -> pd.DataFrame:
    """Per user and window: rows and their amount, in plain Python (windows ending after the
    watermark ``before`` left out: they have not fired)."""
    rows: dict[tuple[str, int, int], list[float]] = {}
    micros = (clicks["ts"] - pd.Timestamp(0)) // pd.Timedelta(microseconds=1)
    for user, at, amount in zip(clicks["user_id"], micros, clicks["amount"], strict=True):
        for start, end in windows_of(int(at), *window):
            if before is None or end - 1 <= before:
                rows.setdefault((user, start, end), []).append(amount)
    frame = pd.DataFrame(
        [(u, s, e, len(a), round(sum(a), 6)) for (u, s, e), a in rows.items()],
        columns=["user_id", "window_start", "window_end", "n", "total"],
    )
    for column in ("window_start", "window_end"):
        frame[column] = pd.to_datetime(frame[column], unit="us")
    return frame


TOP_USERS = """
CREATE TABLE top_users (window_start TIMESTAMP(3), window_end TIMESTAMP(3), user_id STRING, n BIGINT, total DOUBLE,
  rn BIGINT) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet');
INSERT INTO top_users SELECT * FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY total DESC, user_id) AS rn FROM (
    SELECT window_start, window_end, user_id, COUNT(*) AS n, SUM(amount) AS total
    FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '10' MINUTE))
    GROUP BY window_start, window_end, user_id))
WHERE rn <= 3;
"""


WINDOW_TIMES = """
CREATE TABLE window_times (user_id STRING, window_time TIMESTAMP(3), n BIGINT, late_by_a_second TIMESTAMP(3))
  WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet');
INSERT INTO window_times SELECT user_id, window_time, COUNT(*), window_time + INTERVAL '1' SECOND
  FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '10' MINUTE))
  GROUP BY user_id, window_start, window_end, window_time HAVING window_time > TIMESTAMP '2026-05-04 10:15:00';
"""


def top_users(windows: pd.DataFrame) -> pd.DataFrame:
    """Flink's window Top-N over per-user window aggregates, in pandas: each window's three
    largest totals (ties by user), numbered."""
    ordered = windows.sort_values(["window_start", "total", "user_id"], ascending=[True, False, True])
    ordered["rn"] = ordered.groupby("window_start").cumcount() + 1
    return ordered[ordered["rn"] <= 3][["window_start", "window_end", "user_id", "n", "total", "rn"]]


def write_clicks(directory: Path, files: int) -> pd.DataFrame:
    """Clicks of 25 users over 40 minutes in time order, ``files`` Parquet files."""
    rng = np.random.default_rng(12)
    times = np.sort(rng.integers(0, 40 * 60_000, 2_000))
    clicks = pd.DataFrame(
        {
            "user_id": [f"u{n}" for n in rng.integers(0, 25, 2_000)],
            "amount": np.round(rng.uniform(1, 50, 2_000), 2),
            "ts": (START + pd.to_timedelta(times, unit="ms")).astype("M8[us]"),
        }
    )
    write_parts(directory, split(clicks, files))
    return clicks


def script(clicks: Path, out: Path, watch: str, sinks: list[str]) -> str:
    text = (
        "CREATE TABLE clicks (user_id STRING, amount DOUBLE, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL "
        f"'5' SECOND) WITH ('connector' = 'filesystem', 'path' = '{clicks}', 'format' = 'parquet'{watch});\n"
    )
    for sink in sinks:
        text += (
            f"CREATE TABLE {sink} (user_id STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), n BIGINT, "
            f"total DOUBLE) WITH ('connector' = 'filesystem', 'path' = '{out / sink}', 'format' = 'parquet');\n"
            f"INSERT INTO {sink} SELECT user_id, window_start, window_end, COUNT(*), SUM(amount) FROM "
            f"TABLE({WINDOWS[sink][0]}) GROUP BY user_id, window_start, window_end;\n"
        )
    return text


def assert_windows(got: pd.DataFrame, want: pd.DataFrame, at_least: int = 50) -> None:
    assert len(want) >= at_least
    columns = ["user_id", "window_start", "window_end"]
    got = got[list(want.columns)].assign(total=got["total"].round(6)).astype(dict.fromkeys(columns[1:], "M8[us]"))
    want = want.astype(dict.fromkeys(columns[1:], "M8[us]"))
    pd.testing.assert_frame_equal(
        got.sort_values(columns, ignore_index=True), want.sort_values(columns, ignore_index=True), check_dtype=False
    )


@pytest.mark.jvm
def test_cumulate_and_window_offsets_equal_python(tmp_path: Path) -> None:
    """A bounded run fires every window: each sink's windows and aggregates equal Python's."""
    clicks = write_clicks(tmp_path / "clicks", files=1)
    pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, "spark.sql.session.timeZone": "UTC"})
    pipeline.sql(script(tmp_path / "clicks", tmp_path / "out", "", list(WINDOWS))
                 + TOP_USERS.format(path=tmp_path / "out" / "top_users")
                 + WINDOW_TIMES.format(path=tmp_path / "out" / "window_times"))  # fmt: skip
    pipeline.run()
    # Flink's window_time: the window's end less a millisecond (here a plain timestamp)
    tumbling = expected(clicks, ("tumble", 10, 10, 0))
    want = tumbling.assign(window_time=tumbling["window_end"] - pd.Timedelta(milliseconds=1))
    want = want.assign(late_by_a_second=want["window_time"] + pd.Timedelta(seconds=1))
    want = want[want["window_time"] > pd.Timestamp("2026-05-04 10:15:00")]  # HAVING drops the first window
    columns = ["user_id", "window_time", "n", "late_by_a_second"]
    got = read_output(tmp_path / "out" / "window_times")[columns].astype(
        {"window_time": "M8[us]", "late_by_a_second": "M8[us]"}
    )
    got, want = (
        got.sort_values(columns[:2], ignore_index=True),
        want[columns].sort_values(columns[:2], ignore_index=True),
    )
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    for sink, (_, window) in WINDOWS.items():
        assert_windows(read_output(tmp_path / "out" / sink), expected(clicks, window))
    top = top_users(expected(clicks, ("tumble", 10, 10, 0)))
    assert_windows(read_output(tmp_path / "out" / "top_users"), top, at_least=12)  # 3 of each of 4 windows


@pytest.mark.jvm
def test_cumulating_windows_stream_over_micro_batches(tmp_path: Path) -> None:
    """Three micro-batches: each cumulating window fires once, when the watermark passes its
    end; those the final watermark has not passed are not emitted yet."""
    clicks = write_clicks(tmp_path / "clicks", files=3)
    config = {**TEST_SPARK, "spark.sql.session.timeZone": "UTC", "execution.checkpointing.interval": "0 s"}
    pipeline = Pipeline(parallelism=2, config=config)
    watch = ", 'source.watch' = 'true', 'source.max-files-per-batch' = '1'"
    pipeline.sql(script(tmp_path / "clicks", tmp_path / "out", watch, ["cumulate"])
                 + TOP_USERS.format(path=tmp_path / "out" / "top_users"))  # fmt: skip
    assert "per_window=window_end" in pipeline.plan().render()  # Flink's window Top-N
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 3
    marks = Checkpoint(str(tmp_path / "ckpt")).manifests.latest().watermarks  # type: ignore[union-attr]
    watermark = next(iter(marks.values()))["watermark"]
    got = read_output(tmp_path / "out" / "cumulate")
    assert not got.duplicated(["user_id", "window_start", "window_end"]).any()  # each window fires once
    assert_windows(got, expected(clicks, WINDOWS["cumulate"][1], before=watermark))
    ranked = read_output(tmp_path / "out" / "top_users")
    assert "op" not in ranked.columns  # insert-only: each window ranked once, when it ends
    assert_windows(ranked, top_users(expected(clicks, ("tumble", 10, 10, 0), before=watermark)), at_least=9)


@pytest.mark.parametrize(
    ("offset", "micros"),
    [("INTERVAL -'8' HOUR", 16 * 60 * MINUTE), ("INTERVAL '-16' MINUTE", (24 * 60 - 16) * MINUTE),
     ("INTERVAL '25' HOUR", 60 * MINUTE)],
)  # fmt: skip
def test_window_offsets_as_flink_reads_them(offset: str, micros: int) -> None:
    """Any offset, negative ones written either way, counts modulo the period (Flink's window
    offsets: -16 min on 10 min windows is the same as +4 min)."""
    from keyflow.plan.nodes import WindowAggregateNode

    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    pipeline.sql(
        script(Path("/tmp/clicks"), Path("/tmp/out"), "", ["tumble_offset"]).replace(
            "INTERVAL '10' MINUTE, INTERVAL '3' MINUTE", f"INTERVAL '1' DAY, {offset}"
        )
    )
    (window,) = [n for n in pipeline.operators.values() if isinstance(n, WindowAggregateNode)]
    assert window.windowing.assigner.offset == micros


@pytest.mark.jvm
def test_processing_time_windows_fire_once_a_micro_batch_runs_after_their_end(tmp_path: Path) -> None:
    """Flink's processing-time windows (TUMBLE over a PROCTIME() column, Nexmark q12): each
    micro-batch's rows are in the window of the time it runs at; a window is emitted at the
    first micro-batch that runs after its end, so after a restart (at another parallelism) a
    second later, every window of the first run is out, each once, and the last one waits."""
    parts = split(write_clicks(tmp_path / "all", files=1), 3)
    script = (
        "CREATE TABLE clicks (user_id STRING, amount DOUBLE, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', "
        f"'path' = '{tmp_path / 'clicks'}', 'format' = 'parquet', 'source.watch' = 'true', "
        "'source.max-files-per-batch' = '1');\n"
        "CREATE VIEW timed AS SELECT *, PROCTIME() AS p_time FROM clicks;\n"
        f"CREATE TABLE out (user_id STRING, n BIGINT, starts TIMESTAMP(3), ends TIMESTAMP(3)) WITH ('connector' = "
        f"'filesystem', 'path' = '{tmp_path / 'out'}', 'format' = 'parquet');\n"
        "INSERT INTO out SELECT user_id, COUNT(*), window_start, window_end FROM TABLE(TUMBLE(TABLE timed, "
        "DESCRIPTOR(p_time), INTERVAL '1' SECOND)) GROUP BY user_id, window_start, window_end;"
    )
    write_parts(tmp_path / "clicks", parts[:2])
    config = {**TEST_SPARK, "spark.sql.session.timeZone": "UTC", "execution.checkpointing.interval": "0 s"}
    for parallelism in (2, 3):
        if parallelism == 3:
            time.sleep(1.1)  # the first run's windows have all ended
            write_parts(tmp_path / "clicks", parts[2:], first=2)
            restarted = pd.Timestamp.now(tz="UTC").tz_localize(None)
        pipeline = Pipeline(parallelism=parallelism, config=config)
        pipeline.sql(script)
        pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    out = read_output(tmp_path / "out")
    assert ((out["ends"] - out["starts"]) == pd.Timedelta(seconds=1)).all()
    assert (out["ends"] <= restarted).all()  # the restart's own window is still open
    assert not out.duplicated(["user_id", "starts"]).any()  # each window emitted once
    expected = pd.concat(parts[:2]).groupby("user_id").size()
    pd.testing.assert_series_equal(out.groupby("user_id")["n"].sum(), expected, check_names=False)
