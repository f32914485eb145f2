"""OVER aggregations (Flink's): each row with aggregates of its key's rows in a frame ordered by
event time. Bounded and streamed (over micro-batches, restarted at another parallelism) they
equal DuckDB's window functions over the same files; tests named after Flink's
OverAggregateITCase; late rows dropped and counted as Flink's RowTime*PrecedingFunction drops
them; every unsupported form refused before Spark starts."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from keyflow import Pipeline, WatermarkStrategy, files, parquet
from keyflow.errors import PlanError
from keyflow.plan.nodes import OverFrame, OverNode
from keyflow.sql.errors import SqlError
from tests.pipelines import TEST_SPARK
from tests.streams import read_output, run_restarted, split, write_parts

START = pd.Timestamp("2026-03-01 12:00")
CONFIG = {**TEST_SPARK, "spark.sql.session.timeZone": "UTC", "execution.checkpointing.interval": "0 s"}
FRAMES = {  # Flink's OverAggregateITCase: row-time, partitioned, bounded and unbounded, ROWS and RANGE
    "bounded_rows": "ROWS BETWEEN 3 PRECEDING AND CURRENT ROW",
    "bounded_range": "RANGE BETWEEN INTERVAL '30' SECOND PRECEDING AND CURRENT ROW",
    "unbounded_rows": "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW",
    "unbounded_range": "",  # with ORDER BY and no frame: RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
}
SELECTED = ("SELECT user_id, amount, price, ts, COUNT(*) OVER w AS n, COUNT(amount) OVER w AS valued, "
            "SUM(amount) OVER w AS total, AVG(price) OVER w AS mean, MIN(price) OVER w AS low, "
            "MAX(ts) OVER w AS latest FROM clicks WINDOW w AS (PARTITION BY user_id ORDER BY ts {frame})")  # fmt: skip
TABLES = """
CREATE TABLE clicks (user_id STRING, amount BIGINT, price DOUBLE, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet'{watch});
CREATE TABLE out (user_id STRING, amount BIGINT, price DOUBLE, ts TIMESTAMP(3), n BIGINT, valued BIGINT,
  total BIGINT, mean DOUBLE, low DOUBLE, latest TIMESTAMP(3))
WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'parquet');
"""
WATCHED = ", 'source.watch' = 'true', 'source.max-files-per-batch' = '1'"


def clicks(ties: bool, rows: int = 1_200, seed: int = 3) -> pd.DataFrame:
    """Clicks of 15 users over ten minutes in time order, some amounts and prices null, and one
    user ("u0") paying ~1e15 (a key's sums must not take in another's); with ``ties`` the
    times are whole seconds, so a key has rows of an equal time (RANGE peers)."""
    rng = np.random.default_rng(seed)
    offsets = np.sort(rng.choice(600_000, rows, replace=False)) if not ties else np.sort(rng.integers(0, 600, rows))
    unit = "s" if ties else "ms"
    amount = pd.array(rng.integers(1, 100, rows), dtype="Int64")
    amount[rng.random(rows) < 0.1] = pd.NA
    users = np.array([f"u{n}" for n in rng.integers(0, 15, rows)])
    price = np.round(rng.uniform(1, 50, rows), 2)
    price[users == "u0"] *= 1e14
    price[rng.random(rows) < 0.1] = np.nan
    return pd.DataFrame({"user_id": users, "amount": amount, "price": price,
                         "ts": (START + pd.to_timedelta(offsets, unit=unit)).astype("M8[us]")})  # fmt: skip


def duckdb_answer(frame: pd.DataFrame, window: str) -> pd.DataFrame:
    con = duckdb.connect()
    con.register("clicks", frame)
    return con.sql(SELECTED.format(frame=window)).df()


def same_rows(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert len(expected) > 200
    columns = list(expected.columns)
    order = ["user_id", "ts", "amount", "price"]
    times = {"ts": "M8[us]", "latest": "M8[us]"}
    got, expected = (f[columns].astype(times).convert_dtypes().sort_values(order, ignore_index=True)
                     for f in (got, expected))  # fmt: skip
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, rtol=1e-9)


@pytest.mark.jvm
@pytest.mark.parametrize("frame", list(FRAMES))
def test_row_time_partitioned_over_bounded_equals_duckdb(tmp_path: Path, frame: str) -> None:
    """A bounded job: Spark's window functions over each key's rows in time order."""
    data = clicks(ties="range" in frame)
    write_parts(tmp_path / "clicks", [data])
    pipeline = Pipeline(parallelism=2, config=CONFIG)
    pipeline.sql(TABLES.format(path=tmp_path / "clicks", watch="", out=tmp_path / "out")
                 + f"INSERT INTO out {SELECTED.format(frame=FRAMES[frame])};")  # fmt: skip
    pipeline.run()
    same_rows(read_output(tmp_path / "out"), duckdb_answer(data, FRAMES[frame]))


@pytest.mark.jvm
@pytest.mark.parametrize("frame", list(FRAMES))
def test_row_time_partitioned_over_streamed_across_a_restart_at_another_parallelism(tmp_path: Path, frame: str) -> None:
    """Two micro-batches at parallelism 2, then a restart at 3 that reads a third: the rows
    the final watermark passed are emitted, each once, with DuckDB's aggregates over all the
    rows (the state kept for later frames moved with its key groups)."""
    data = clicks(ties="range" in frame)
    script = (TABLES.format(path=tmp_path / "clicks", watch=WATCHED, out=tmp_path / "out")
              + f"INSERT INTO out {SELECTED.format(frame=FRAMES[frame])};")  # fmt: skip
    run_restarted(script, tmp_path / "clicks", split(data, 3), tmp_path / "ckpt", CONFIG)
    watermark = data["ts"].max() - pd.Timedelta(seconds=5) - pd.Timedelta(microseconds=1)
    expected = duckdb_answer(data, FRAMES[frame])
    assert (expected["ts"] > watermark).any(), "every row fired: waiting for the watermark is not tested"
    same_rows(read_output(tmp_path / "out"), expected[expected["ts"] <= watermark])


@pytest.mark.jvm
@pytest.mark.parametrize("frame", ["unbounded_rows", "bounded_rows"])
def test_late_rows_are_dropped_and_counted(tmp_path: Path, frame: str) -> None:
    """As Flink's RowTime*PrecedingFunction: a row at or before the last time its key fired is
    late: dropped, counted in the micro-batch's late rows, and in no later frame. Unbounded
    (AbstractRowTimeUnboundedPrecedingOver) a row at or before the watermark is late too: a
    new key's early row is dropped there and kept by the bounded frame."""
    data = clicks(ties=False, rows=300)
    late = data.iloc[:20].assign(amount=pd.array([1_000] * 20, dtype="Int64"))
    newcomer = data.iloc[:1].assign(user_id="new", amount=pd.array([7], dtype="Int64"))
    write_parts(tmp_path / "clicks", [data, pd.concat([late, newcomer])])
    pipeline = Pipeline(parallelism=2, config=CONFIG)
    pipeline.sql(TABLES.format(path=tmp_path / "clicks", watch=WATCHED, out=tmp_path / "out")
                 + f"INSERT INTO out {SELECTED.format(frame=FRAMES[frame])};")  # fmt: skip
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    unbounded = frame.startswith("unbounded")
    assert [sum(batch.late_rows_dropped.values()) for batch in result.batches] == [0, 21 if unbounded else 20]
    watermark = data["ts"].max() - pd.Timedelta(seconds=5) - pd.Timedelta(microseconds=1)
    kept = data if unbounded else pd.concat([data, newcomer])
    expected = duckdb_answer(kept, FRAMES[frame])
    same_rows(read_output(tmp_path / "out"), expected[expected["ts"] <= watermark])


@pytest.mark.jvm
@pytest.mark.parametrize("streamed", [False, True])
def test_keyed_stream_over_equals_pandas(tmp_path: Path, streamed: bool) -> None:
    """The Python API: ``key_by(...).over('30 s', total=…)`` is the RANGE frame; the answer from
    pandas' time-based rolling windows (rows of an equal time share the last one's), bounded
    and over a watched directory (the rows the final watermark passed)."""
    data = clicks(ties=True, rows=600).dropna()
    write_parts(tmp_path / "clicks", split(data.assign(ts=data["ts"].dt.tz_localize("UTC")), 2))  # an instant
    pipeline = Pipeline(parallelism=2, config=CONFIG)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", "5 s")
    options = {"maxFilesPerTrigger": "1"} if streamed else {}
    stream = pipeline.source(files(tmp_path / "clicks", watch=streamed, **options), watermark=strategy)
    stream.key_by("user_id").over("30 s", total="sum(amount)", n="count(*)").sink(parquet(tmp_path / "out"))
    if streamed:
        assert len(pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True).batches) == 2
    else:
        pipeline.run()
    ordered = data.sort_values(["user_id", "ts"], kind="stable").set_index("ts")
    rolling = ordered.groupby("user_id")["amount"].rolling("31s", closed="right")  # (t - 31 s, t]: whole seconds
    expected = ordered.reset_index().assign(total=rolling.sum().to_numpy(), n=rolling.count().to_numpy())
    peers = expected.groupby(["user_id", "ts"])[["total", "n"]].transform("last")
    expected[["total", "n"]] = peers
    if streamed:
        expected = expected[expected["ts"] <= data["ts"].max() - pd.Timedelta(seconds=5, microseconds=1)]
    got = read_output(tmp_path / "out")[list(expected.columns)]
    got["ts"] = got["ts"].dt.tz_convert("UTC").dt.tz_localize(None) if got["ts"].dt.tz else got["ts"]
    order = ["user_id", "ts", "amount", "price"]
    pd.testing.assert_frame_equal(got.astype({"ts": "M8[us]"}).sort_values(order, ignore_index=True),
                                  expected.astype({"ts": "M8[us]"}).sort_values(order, ignore_index=True),
                                  check_dtype=False)  # fmt: skip


def test_keyed_stream_over_refuses_a_frame_of_the_wrong_kind(tmp_path: Path) -> None:
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("ts", "5 s")
    keyed = pipeline.source(files(tmp_path, schema="user_id string, ts timestamp"), watermark=strategy).key_by(
        "user_id"
    )
    with pytest.raises(PlanError, match=r"over\(preceding=10\) is a time range; give a duration such as '10 s'"):
        keyed.over(10, n="count(*)")
    with pytest.raises(PlanError, match=r"over\(preceding='1 min', rows=True\) counts rows; give a whole number"):
        keyed.over("1 min", rows=True, n="count(*)")
    untimed = pipeline.source(files(tmp_path, schema="user_id string, ts timestamp")).key_by("user_id")
    with pytest.raises(PlanError, match=r"its input has none; give the source a watermark \(source\(\.\.\., "):
        untimed.over(n="count(*)")


def refused(query: str) -> str:
    with pytest.raises(SqlError) as error:
        Pipeline(parallelism=2, config=TEST_SPARK).sql(
            TABLES.format(path="/tmp/none", watch="", out="/tmp/none-out") + f"INSERT INTO out {query};"
        )
    return str(error.value)


COLUMNS = "SELECT user_id, amount, price, ts, {}, 0, 0, 0.0, 0.0, ts FROM clicks"


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ("COUNT(*) OVER (PARTITION BY user_id ORDER BY price)",
         r"OVER at line 8, column \d+: over \(out\): OVER … ORDER BY price: an OVER aggregation is "
         r"ordered by the event time \(the source's WATERMARK column\), ascending, as in Flink; its event-time "
         r"column is 'ts'"),
        ("COUNT(*) OVER (PARTITION BY user_id ORDER BY ts DESC)", "must be ORDER BY the event-time column"),
        ("COUNT(*) OVER (ORDER BY ts)", r"OVER at line 8, column \d+ needs PARTITION BY"),
        ("COUNT(*) OVER (PARTITION BY user_id ORDER BY ts ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING)",
         "must end at CURRENT ROW"),
        ("COUNT(*) OVER (PARTITION BY user_id ORDER BY ts ROWS BETWEEN INTERVAL '1' SECOND PRECEDING AND "
         "CURRENT ROW)", "ROWS counts rows: give a whole number of rows PRECEDING"),
        ("COUNT(*) OVER (PARTITION BY user_id ORDER BY ts RANGE BETWEEN 3 PRECEDING AND CURRENT ROW)",
         r"RANGE reaches back in event time: give INTERVAL '…' unit PRECEDING"),
        ("COUNT(DISTINCT amount) OVER (PARTITION BY user_id ORDER BY ts)",
         "DISTINCT and FILTER are not supported in an OVER aggregation yet"),
        ("SUM(user_id) OVER (PARTITION BY user_id ORDER BY ts)",
         r"OVER at line 8, column \d+: SUM\(user_id\) reads a STRING value; an OVER aggregation sums and averages "
         r"integers and floating point numbers"),
        ("COUNT(*) OVER w FROM clicks WINDOW v AS (PARTITION BY user_id ORDER BY ts) --",
         r"OVER w at line 8, column \d+ names no window of the WINDOW clause \(v\)"),
    ],
)  # fmt: skip
def test_over_mistakes_are_named_before_spark(over: str, message: str) -> None:
    query = COLUMNS.format(over)
    if " FROM clicks WINDOW" in over:
        query = f"SELECT user_id, amount, price, ts, {over.split(' FROM')[0]}, 0, 0, 0.0, 0.0, ts FROM clicks " + (
            "WINDOW" + over.split("WINDOW", 1)[1].removesuffix(" --"))  # fmt: skip
    error = refused(query)
    assert re.search(message, error), error


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT user_id, amount, price, ts, COUNT(*) OVER (w ROWS 2 PRECEDING), 0, 0, 0.0, 0.0, ts FROM clicks "
         "WINDOW w AS (PARTITION BY user_id ORDER BY ts ROWS 5 PRECEDING)",
         r"OVER \(w …\) at line 8, column \d+ gives a frame, which window w has already"),
        ("SELECT user_id, amount, price, ts, SUM(COUNT(*) OVER (PARTITION BY user_id ORDER BY ts)) OVER (PARTITION "
         "BY user_id ORDER BY ts), 0, 0, 0.0, 0.0, ts FROM clicks",
         r"OVER at line 8, column \d+ inside the argument of the OVER aggregate at line 8"),
        ("SELECT user_id, amount, price, ts, 0, 0, 0, 0.0, 0.0, ts FROM clicks WHERE COUNT(*) OVER (PARTITION BY "
         "user_id ORDER BY ts) > 1", r"an OVER aggregate belongs in the select list; filter or group by it in an "
         r"outer query"),
        ("SELECT user_id, amount, price, ts, SUM(DISTINCT amount) OVER (PARTITION BY user_id ORDER BY ts), 0, 0, "
         "0.0, 0.0, ts FROM clicks", "DISTINCT and FILTER are not supported in an OVER aggregation yet"),
    ],
)  # fmt: skip
def test_named_windows_and_nesting_mistakes(query: str, message: str) -> None:
    error = refused(query)
    assert re.search(message, error), error


def test_equal_windows_written_differently_and_short_frames_plan_as_one() -> None:
    """As Calcite groups OVER aggregates: names in any case, ``ASC`` and the default frame as
    written out are one window; ``ROWS 2 PRECEDING`` is ``… AND CURRENT ROW``; ``OVER (w
    ORDER BY ts)`` adds the order to the named window."""
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    pipeline.sql(
        TABLES.format(path="/tmp/none", watch="", out="/tmp/none-out")
        + "INSERT INTO out SELECT user_id, amount, price, ts, COUNT(*) OVER (PARTITION BY user_id ORDER BY ts), "
        "COUNT(amount) OVER (PARTITION BY USER_ID ORDER BY TS ASC RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW), "
        "SUM(amount) OVER (w ORDER BY ts), 0.0, 0.0, ts FROM clicks WINDOW w AS (PARTITION BY user_id);"
        "CREATE TABLE short (user_id STRING, n BIGINT) WITH ('connector' = 'blackhole');"
        "INSERT INTO short SELECT user_id, COUNT(*) OVER (PARTITION BY user_id ORDER BY ts ROWS 2 PRECEDING) "
        "FROM clicks;"
    )
    frames = [node.frame for node in pipeline.operators.values() if isinstance(node, OverNode)]
    assert frames == [OverFrame(), OverFrame(rows=True, preceding=2)]


def test_two_different_windows_in_one_query_are_refused() -> None:
    error = refused("SELECT user_id, amount, price, ts, COUNT(*) OVER (PARTITION BY user_id ORDER BY ts), "
                    "SUM(amount) OVER (PARTITION BY price ORDER BY ts), 0, 0.0, 0.0, ts FROM clicks")  # fmt: skip
    assert re.search(r"OVER at line 8, column \d+ differs from the OVER at line 8, column \d+; as in Flink", error)
