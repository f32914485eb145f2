"""Window Top-N and window deduplication right after a window table function (Flink's
WindowRankITCase, WindowDeduplicateITCase): each key's first rows per window, bounded and
streamed (across a restart at another parallelism), equal to DuckDB's over the same files;
late rows dropped and counted; the forms Flink refuses refused by name."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from keyflow import Pipeline
from keyflow.sql.errors import SqlError
from tests.pipelines import TEST_SPARK
from tests.streams import read_output, run_restarted, split, write_parts

START = pd.Timestamp("2026-03-01 11:58")
CONFIG = {**TEST_SPARK, "spark.sql.session.timeZone": "UTC", "execution.checkpointing.interval": "0 s"}
TABLES = """
CREATE TABLE bids (user_id STRING, price BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet'{watch});
CREATE TABLE out (user_id STRING, price BIGINT, ts TIMESTAMP(3), window_start TIMESTAMP(3),
  window_end TIMESTAMP(3), rn BIGINT) WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'parquet');
"""
WATCHED = ", 'source.watch' = 'true', 'source.max-files-per-batch' = '1'"
WINDOWS = {
    "tumble": ("TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '1' MINUTE)", 60, 60),
    "hop": ("HOP(TABLE bids, DESCRIPTOR(ts), INTERVAL '30' SECOND, INTERVAL '2' MINUTE)", 120, 30),
}
TOP_N = ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, user_id ORDER BY price "
         "DESC) AS rn FROM TABLE({window})) WHERE rn <= 2")  # fmt: skip
DEDUPLICATE = ("SELECT user_id, price, ts, window_start, window_end, 1 FROM (SELECT *, ROW_NUMBER() OVER "
               "(PARTITION BY window_start, window_end, user_id ORDER BY ts {direction}) AS rn FROM TABLE({window})) "
               "WHERE rn = 1")  # fmt: skip


def bids(rows: int = 900, seed: int = 6) -> pd.DataFrame:
    """Bids of 6 users over six minutes in time order, distinct prices and times."""
    rng = np.random.default_rng(seed)
    offsets = np.sort(rng.choice(360_000, rows, replace=False))
    return pd.DataFrame({"user_id": [f"u{n}" for n in rng.integers(0, 6, rows)],
                         "price": rng.permutation(rows).astype(np.int64) * 3,
                         "ts": (START + pd.to_timedelta(offsets, unit="ms")).astype("M8[us]")})  # fmt: skip


def duckdb_answer(frame: pd.DataFrame, window: str, ranked: str) -> pd.DataFrame:
    """Each row in each of its windows (Flink's: starts every slide, the last one at or before
    the row), then ranked per user and window by ``ranked`` (a window function's ORDER BY)."""
    _, size, slide = WINDOWS[window]
    con = duckdb.connect()
    con.register("bids", frame)
    return con.sql(f"""
        WITH windowed AS (
          SELECT b.*, to_timestamp(s) AS window_start, to_timestamp(s + {size}) AS window_end
          FROM bids b, unnest(generate_series(
            CAST(floor(epoch(b.ts) / {slide}) * {slide} - {size} + {slide} AS BIGINT),
            CAST(floor(epoch(b.ts) / {slide}) * {slide} AS BIGINT), {slide})) AS t(s))
        SELECT user_id, price, ts, window_start::TIMESTAMP AS window_start, window_end::TIMESTAMP AS window_end,
          row_number() OVER (PARTITION BY window_start, window_end, user_id ORDER BY {ranked}) AS rn
        FROM windowed QUALIFY rn <= 2""").df()  # fmt: skip


def same_rows(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert len(expected) > 20
    columns = ["user_id", "price", "ts", "window_start", "window_end", "rn"]
    times = dict.fromkeys(["ts", "window_start", "window_end"], "M8[us]")
    got, expected = (f[columns].astype(times).sort_values(columns, ignore_index=True) for f in (got, expected))
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def closed(frame: pd.DataFrame, data: pd.DataFrame) -> pd.DataFrame:
    """The rows of the windows the final watermark passed."""
    watermark = data["ts"].max() - pd.Timedelta(seconds=5) - pd.Timedelta(microseconds=1)
    return frame[frame["window_end"] - pd.Timedelta(microseconds=1) <= watermark]


@pytest.mark.jvm
@pytest.mark.parametrize("window", list(WINDOWS))
def test_window_top_n_bounded_equals_duckdb(tmp_path: Path, window: str) -> None:
    data = bids()
    write_parts(tmp_path / "bids", [data])
    pipeline = Pipeline(parallelism=2, config=CONFIG)
    pipeline.sql(TABLES.format(path=tmp_path / "bids", watch="", out=tmp_path / "out")
                 + f"INSERT INTO out {TOP_N.format(window=WINDOWS[window][0])};")  # fmt: skip
    pipeline.run()
    same_rows(read_output(tmp_path / "out"), duckdb_answer(data, window, "price DESC"))


@pytest.mark.jvm
@pytest.mark.parametrize("window", list(WINDOWS))
def test_window_top_n_streamed_across_a_restart_at_another_parallelism(tmp_path: Path, window: str) -> None:
    """Each window's first rows are emitted once, when the watermark passes its end: two
    micro-batches at parallelism 2, a restart at 3 reading a third; the windows still open
    at the end are not emitted."""
    data = bids()
    script = (TABLES.format(path=tmp_path / "bids", watch=WATCHED, out=tmp_path / "out")
              + f"INSERT INTO out {TOP_N.format(window=WINDOWS[window][0])};")  # fmt: skip
    run_restarted(script, tmp_path / "bids", split(data, 3), tmp_path / "ckpt", CONFIG)
    expected = duckdb_answer(data, window, "price DESC")
    assert len(closed(expected, data)) < len(expected), "every window closed: waiting is not tested"
    same_rows(read_output(tmp_path / "out"), closed(expected, data))


@pytest.mark.jvm
@pytest.mark.parametrize("direction", ["ASC", "DESC"])
def test_window_deduplicate_keeps_the_first_or_last_row(tmp_path: Path, direction: str) -> None:
    """Flink's window deduplication: ROW_NUMBER() … ORDER BY the event time, rn = 1: each
    user's first (ASC) or last (DESC) row of each window, streamed."""
    data = bids()
    write_parts(tmp_path / "bids", split(data, 3))
    pipeline = Pipeline(parallelism=2, config=CONFIG)
    query = DEDUPLICATE.format(direction=direction, window=WINDOWS["tumble"][0])
    pipeline.sql(
        TABLES.format(path=tmp_path / "bids", watch=WATCHED, out=tmp_path / "out") + f"INSERT INTO out {query};"
    )
    pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    expected = duckdb_answer(data, "tumble", f"ts {direction}")
    same_rows(read_output(tmp_path / "out"), closed(expected[expected["rn"] == 1], data))


@pytest.mark.jvm
def test_rows_of_ended_windows_are_late_dropped_and_counted(tmp_path: Path) -> None:
    """A row whose windows all ended before its micro-batch is late: dropped and counted; it
    enters no window (a window is emitted once)."""
    data = bids()
    late = data.iloc[:30].assign(price=10_000_000)
    write_parts(tmp_path / "bids", [data, late])
    pipeline = Pipeline(parallelism=2, config=CONFIG)
    pipeline.sql(TABLES.format(path=tmp_path / "bids", watch=WATCHED, out=tmp_path / "out")
                 + f"INSERT INTO out {TOP_N.format(window=WINDOWS['tumble'][0])};")  # fmt: skip
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert [sum(batch.late_rows_dropped.values()) for batch in result.batches] == [0, 30]
    same_rows(read_output(tmp_path / "out"), closed(duckdb_answer(data, "tumble", "price DESC"), data))


@pytest.mark.jvm
def test_window_deduplicate_keeping_the_last_row_takes_a_later_row_of_an_equal_time(tmp_path: Path) -> None:
    """Flink's RowTimeWindowDeduplicateProcessor: keeping the last row, a later row of an equal
    time replaces the kept one (across micro-batches); keeping the first, it does not."""
    times = (START + pd.to_timedelta([5, 5, 7], unit="s")).astype("M8[us]")
    parts = [pd.DataFrame({"user_id": ["u1"] * 1, "price": [price], "ts": times[i : i + 1]})
             for i, price in enumerate([10, 20, 5])]  # fmt: skip
    parts[2] = parts[2].assign(ts=times[:1], price=30)  # the third: the same time as the first two
    write_parts(tmp_path / "bids", parts)
    later = pd.DataFrame({"user_id": ["u1"], "price": [1], "ts": [START + pd.Timedelta(minutes=5)]})
    write_parts(tmp_path / "bids", [later.astype({"ts": "M8[us]"})], first=3)  # closes the first minute
    script = TABLES.format(path=tmp_path / "bids", watch=WATCHED, out=tmp_path / "out")
    for direction in ("ASC", "DESC"):
        deduplicated = DEDUPLICATE.format(direction=direction, window=WINDOWS["tumble"][0])
        script += (f"CREATE TABLE out_{direction} (user_id STRING, price BIGINT) WITH ('connector' = 'filesystem', "
                   f"'path' = '{tmp_path / direction}', 'format' = 'parquet');\nINSERT INTO out_{direction} SELECT "
                   f"user_id, price FROM ({deduplicated});\n")  # fmt: skip
    pipeline = Pipeline(parallelism=2, config=CONFIG)
    pipeline.sql(script)
    assert len(pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True).batches) == 4
    assert read_output(tmp_path / "ASC")["price"].tolist() == [10]
    assert read_output(tmp_path / "DESC")["price"].tolist() == [30]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY price) AS rn FROM TABLE({w})) "
         "WHERE rn <= 2", r"needs PARTITION BY window_start, window_end\[, keys\] and ORDER BY: as Flink's window "
         r"Top-N"),
        ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY window_start) "
         "AS rn FROM TABLE({w})) WHERE rn <= 2", r"ORDER BY window_start or window_end at line \d+, column \d+"),
        ("SELECT user_id, price, ts, window_start, window_end, rn FROM (SELECT user_id, price, ts, window_start, "
         "window_end, window_end - INTERVAL '1' SECOND AS last_second, ROW_NUMBER() OVER (PARTITION BY "
         "window_start, window_end ORDER BY price) AS rn FROM TABLE({w})) WHERE rn <= 2",
         r"computes with the windows of TUMBLE\(…\), which keyflow makes in the window Top-N"),
        ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY price) AS rn "
         "FROM TABLE(SESSION(TABLE bids PARTITION BY user_id, DESCRIPTOR(ts), INTERVAL '1' MINUTE))) WHERE rn <= 2",
         r"over SESSION\(…\) at line \d+, column \d+: a window Top-N of session windows is not supported"),
        ("SELECT user_id, price, ts, window_start, window_time, 0 FROM TABLE({w})",
         r"column window_time at line \d+, column \d+: keyflow gives Flink's window_time \(window_end less a "
         r"millisecond\) in a window aggregation's select list, GROUP BY and HAVING only"),
        ("SELECT * FROM (SELECT user_id, price, ts, window_start AS ws, window_end, ROW_NUMBER() OVER (PARTITION BY "
         "window_start, window_end ORDER BY price) AS rn FROM TABLE({w})) WHERE rn <= 2",
         r"window_start AS ws at line \d+, column \d+ renames window_start, which keyflow makes in the window Top-N"),
        ("SELECT user_id, n, window_start, window_start, window_end, rn FROM (SELECT user_id, n, window_start, "
         "window_end, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY n) AS rn FROM (SELECT user_id, "
         "COUNT(*) AS n, window_start, window_end FROM TABLE(TUMBLE(TABLE timed, DESCRIPTOR(p), INTERVAL '1' "
         "MINUTE)) GROUP BY user_id, window_start, window_end)) WHERE rn <= 2",
         r"a Top-N of the windows of '.*', which are by processing time, is not supported \(nor is it in Flink\)"),
        ("SELECT user_id, 0, CAST(NULL AS TIMESTAMP(3)), window_start, window_time, COUNT(*) FROM TABLE(TUMBLE(TABLE "
         "timed, DESCRIPTOR(p), INTERVAL '1' MINUTE)) GROUP BY user_id, window_start, window_end",
         r"window_time at line \d+, column \d+ of processing-time windows is, in Flink, the time each window is "
         r"emitted at; keyflow does not give it: select window_end"),
        ("SELECT L.user_id, L.price, L.ts, L.window_start, L.window_end, 0 FROM (SELECT * FROM TABLE(TUMBLE(TABLE "
         "timed, DESCRIPTOR(p), INTERVAL '1' MINUTE))) L JOIN (SELECT * FROM TABLE(TUMBLE(TABLE timed, DESCRIPTOR(p), "
         "INTERVAL '1' MINUTE))) R ON L.user_id = R.user_id AND L.window_start = R.window_start AND L.window_end = "
         "R.window_end", r"p is a PROCTIME\(\) column; keyflow runs processing-time windows as window aggregations "
         r"\(GROUP BY window_start, window_end\), not in a window join"),
    ],
)  # fmt: skip
def test_window_top_n_mistakes_are_named_before_spark(query: str, message: str) -> None:
    with pytest.raises(SqlError) as refused:
        Pipeline(parallelism=2, config=TEST_SPARK).sql(
            TABLES.format(path="/tmp/none", watch="", out="/tmp/none-out")
            + "CREATE VIEW timed AS SELECT *, PROCTIME() AS p FROM bids;\n"
            + f"INSERT INTO out {query.format(w=WINDOWS['tumble'][0])};"
        )
    assert re.search(message, str(refused.value)), refused.value
