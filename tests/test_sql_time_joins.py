"""SQL joins by time: a condition that bounds one table's event time by the other's runs as
Flink's interval join (its bounds read as Flink's ``IntervalJoinUtil`` reads them), a join of
two window table functions on their windows as Flink's window join, a join FOR SYSTEM_TIME
AS OF a PROCTIME() column as Flink's lookup join; the answers, bounded and streamed over
micro-batches, equal DuckDB's over the same files."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyflow import Pipeline
from keyflow.changelog import current
from keyflow.plan.event_time import tumbling
from keyflow.plan.nodes import IntervalJoinNode, JoinNode, LookupJoinNode, WindowJoinNode
from keyflow.sql.errors import SqlError
from tests.pipelines import TEST_SPARK
from tests.streams import read_output, split, write_parts

SECOND = 1_000_000
TABLES = """
CREATE TABLE clicks (user_id STRING, page STRING, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
WITH ('connector' = 'filesystem', 'path' = '{clicks}', 'format' = 'parquet'{watch});
CREATE TABLE buys (uid STRING, price DOUBLE, bt TIMESTAMP(3), WATERMARK FOR bt AS bt - INTERVAL '5' SECOND)
WITH ('connector' = 'filesystem', 'path' = '{buys}', 'format' = 'parquet'{watch});
CREATE TABLE out (user_id STRING, page STRING, ts TIMESTAMP(3), price DOUBLE, bt TIMESTAMP(3))
WITH ('connector' = '{sink}'{out});
"""


def joins(condition: str, how: str = "JOIN") -> list[JoinNode]:
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    script = TABLES.format(clicks="/tmp/c", buys="/tmp/b", watch="", sink="blackhole", out="")
    pipeline.sql(script + f"INSERT INTO out SELECT c.user_id, c.page, c.ts, b.price, b.bt FROM clicks c {how} buys b "
                 f"ON c.user_id = b.uid AND {condition};")  # fmt: skip
    return [node for node in pipeline.operators.values() if isinstance(node, JoinNode)]


@pytest.mark.parametrize(
    ("condition", "between"),
    [
        ("b.bt BETWEEN c.ts - INTERVAL '1' MINUTE AND c.ts + INTERVAL '10' SECOND", (-60 * SECOND, 10 * SECOND)),
        ("b.bt > c.ts AND b.bt <= c.ts + INTERVAL '1' HOUR", (1, 3600 * SECOND)),
        ("c.ts >= b.bt - INTERVAL '2' SECOND AND c.ts < b.bt", (1, 2 * SECOND)),  # the left's time bounded
        ("c.ts + INTERVAL '3' SECOND >= b.bt AND b.bt >= c.ts", (0, 3 * SECOND)),  # the interval on either side
        ("(b.bt) BETWEEN c.ts AND c.ts", (0, 0)),
    ],
)
def test_time_bounds_make_an_interval_join(condition: str, between: tuple[int, int]) -> None:
    """IntervalJoinUtil: two range predicates, one bounding ``right - left`` from each side (a
    strict one moves its bound by the time unit, here a microsecond)."""
    (join,) = joins(condition)
    assert isinstance(join, IntervalJoinNode)
    assert (join.lower, join.upper) == between
    assert join.time_columns == ("ts", "bt")


@pytest.mark.parametrize(
    "condition",
    [
        "b.bt > c.ts",  # one range predicate: unbounded above
        "b.bt >= c.ts AND b.bt >= c.ts - INTERVAL '1' SECOND",  # two lower bounds
        "b.bt BETWEEN c.ts AND c.ts + INTERVAL '1' SECOND AND b.bt < c.ts + INTERVAL '2' SECOND",  # three
        "b.bt BETWEEN c.ts AND c.ts + INTERVAL '1' MONTH",  # a month has no fixed length
        "b.price < 10 AND b.bt >= c.ts",
    ],
)
def test_other_time_conditions_filter_a_regular_join(condition: str) -> None:
    """As in Flink: without bounds on both sides the condition filters a regular join."""
    (join,) = joins(condition)
    assert type(join) is JoinNode


def test_an_outer_interval_join_takes_time_bounds_and_equalities_only() -> None:
    (join,) = joins("b.bt BETWEEN c.ts AND c.ts + INTERVAL '1' SECOND", how="LEFT JOIN")
    assert isinstance(join, IntervalJoinNode)
    assert join.how == "left"
    refused = r"LEFT JOIN at line 8, column \d+: the condition b.price > 1 is not an equality of the two tables nor "
    with pytest.raises(SqlError, match=refused + r"a bound of one's event time by the other's"):
        joins("b.bt BETWEEN c.ts AND c.ts + INTERVAL '1' SECOND AND b.price > 1", how="LEFT JOIN")


def inputs(tmp_path: Path, files: int) -> tuple[Path, Path]:
    """Clicks and buys of 40 users over 10 minutes, in time order (``files`` per table)."""
    rng = np.random.default_rng(8)
    start = pd.Timestamp("2026-03-01")

    def times(rows: int) -> pd.Series:
        return (start + pd.to_timedelta(np.sort(rng.integers(0, 600_000, rows)), unit="ms")).astype("M8[us]")

    users = [f"u{n}" for n in rng.integers(0, 40, 1_200)]
    clicks = pd.DataFrame({"user_id": users[:900], "page": rng.choice(["home", "cart"], 900), "ts": times(900)})
    buys = pd.DataFrame({"uid": users[900:], "price": np.round(rng.uniform(1, 90, 300), 2), "bt": times(300)})
    write_parts(tmp_path / "clicks", split(clicks, files))
    write_parts(tmp_path / "buys", split(buys, files))
    return tmp_path / "clicks", tmp_path / "buys"


CONDITION = "b.bt BETWEEN c.ts - INTERVAL '10' SECOND AND c.ts + INTERVAL '20' SECOND"
SELECTED = "SELECT c.user_id, c.page, c.ts, b.price, b.bt FROM clicks c {how} buys b ON c.user_id = b.uid AND {cond}"


def duckdb_answer(clicks: Path, buys: Path, how: str) -> pd.DataFrame:
    query = SELECTED.format(how=how, cond=CONDITION)
    return duckdb.sql(f"WITH clicks AS (FROM '{clicks}/*.parquet'), buys AS (FROM '{buys}/*.parquet') {query}").df()


def same_rows(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert len(expected) > 100
    columns = list(expected.columns)
    times = {c: "M8[us]" for c in columns if pd.api.types.is_datetime64_any_dtype(expected[c])}
    got, expected = (f[columns].astype(times).sort_values(columns, ignore_index=True) for f in (got, expected))
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


@pytest.mark.jvm
@pytest.mark.parametrize("how", ["JOIN", "LEFT JOIN"])
def test_bounded_interval_join_equals_duckdb(tmp_path: Path, how: str) -> None:
    clicks, buys = inputs(tmp_path, files=1)
    pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, "spark.sql.session.timeZone": "UTC"})
    out = f", 'path' = '{tmp_path / 'out'}', 'format' = 'parquet'"
    pipeline.sql(TABLES.format(clicks=clicks, buys=buys, watch="", sink="filesystem", out=out)
                 + f"INSERT INTO out {SELECTED.format(how=how, cond=CONDITION)};")  # fmt: skip
    pipeline.run()
    same_rows(read_output(tmp_path / "out"), duckdb_answer(clicks, buys, how))


@pytest.mark.jvm
def test_streamed_interval_join_over_micro_batches_equals_duckdb(tmp_path: Path) -> None:
    """Three micro-batches of each table: every pair within the bounds is joined once, though
    rows of a batch match rows of the batches before and after it."""
    clicks, buys = inputs(tmp_path, files=3)
    config = {**TEST_SPARK, "spark.sql.session.timeZone": "UTC", "execution.checkpointing.interval": "0 s"}
    pipeline = Pipeline(parallelism=2, config=config)
    watch = ", 'source.watch' = 'true', 'source.max-files-per-batch' = '1'"
    out = f", 'path' = '{tmp_path / 'out'}', 'format' = 'parquet'"
    pipeline.sql(TABLES.format(clicks=clicks, buys=buys, watch=watch, sink="filesystem", out=out)
                 + f"INSERT INTO out {SELECTED.format(how='JOIN', cond=CONDITION)};")  # fmt: skip
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 3
    written = read_output(tmp_path / "out")
    got = current(pa.Table.from_pandas(written, preserve_index=False)).to_pandas() if "op" in written else written
    same_rows(got, duckdb_answer(clicks, buys, "JOIN"))


WINDOWED = "(SELECT * FROM TABLE(TUMBLE(TABLE {table}, DESCRIPTOR({time}), INTERVAL '1' MINUTE))) {alias}"
WINDOW_JOIN = (
    "SELECT L.user_id, L.page, L.ts, R.price, R.bt, L.window_start, L.window_end FROM "
    + WINDOWED.format(table="clicks", time="ts", alias="L")
    + " {how} "
    + WINDOWED.format(table="buys", time="bt", alias="R")
    + " ON L.user_id = R.uid AND L.window_start = R.window_start AND L.window_end = R.window_end"
)
WINDOW_SINK = (
    "CREATE TABLE windowed (user_id STRING, page STRING, ts TIMESTAMP(3), price DOUBLE, bt TIMESTAMP(3), "
    "window_start TIMESTAMP(3), window_end TIMESTAMP(3)) WITH ('connector' = 'filesystem', 'path' = '{path}', "
    "'format' = 'parquet');\n"
)


def planned(query: str) -> Pipeline:
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    script = TABLES.format(clicks="/tmp/c", buys="/tmp/b", watch="", sink="blackhole", out="")
    pipeline.sql(script + WINDOW_SINK.format(path="/tmp/w") + f"INSERT INTO windowed {query};")
    return pipeline


def test_a_join_of_two_window_table_functions_on_their_windows_is_a_window_join() -> None:
    direct = "TABLE(TUMBLE(TABLE {table}, DESCRIPTOR({time}), INTERVAL '1' MINUTE)) {alias}"  # no derived table
    full = WINDOW_JOIN.format(how="FULL JOIN")
    for windowed, alias in ((WINDOWED.format(table="clicks", time="ts", alias="L"), "L"),
                            (WINDOWED.format(table="buys", time="bt", alias="R"), "R")):  # fmt: skip
        table, time = ("clicks", "ts") if alias == "L" else ("buys", "bt")
        full = full.replace(windowed, direct.format(table=table, time=time, alias=alias))
    assert "SELECT *" not in full
    for query in (WINDOW_JOIN.format(how="JOIN"), full):
        (join,) = [n for n in planned(query).operators.values() if isinstance(n, JoinNode)]
        assert isinstance(join, WindowJoinNode)
        assert join.assigner == tumbling("1 min")
        assert join.time_columns == ("ts", "bt")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            WINDOW_JOIN.format(how="JOIN").replace("INTERVAL '1' MINUTE))) R", "INTERVAL '2' MINUTE))) R"),
            r"window join at line 9, column \d+: its tables are windowed differently \(TUMBLE\(…, INTERVAL '1' "
            r"MINUTE\) and TUMBLE\(…, INTERVAL '2' MINUTE\)\); a window join needs the same windows on both",
        ),
        (
            WINDOW_JOIN.format(how="JOIN").replace("TUMBLE(", "SESSION("),
            r"window join at line 9, column \d+ of SESSION windows is not supported; join TUMBLE, HOP or CUMULATE",
        ),
        (
            WINDOW_JOIN.format(how="JOIN").replace(" AND L.window_end = R.window_end", ""),
            r"window join at line 9, column \d+: its condition must equal the tables' windows, e.g. ON "
            r"L.window_start = R.window_start AND L.window_end = R.window_end AND L.k = R.k",
        ),
        (
            "SELECT user_id, page, ts, 1.0, ts, window_start, window_end FROM "
            + WINDOWED.format(table="clicks", time="ts", alias="L"),
            r"TUMBLE\(…\) at line 9, column \d+ is read without GROUP BY window_start, window_end or a window join",
        ),
        (
            WINDOW_JOIN.format(how="JOIN").replace(
                "(SELECT * FROM TABLE(TUMBLE(TABLE clicks",
                "(SELECT user_id, page, ts, window_start + INTERVAL '1' SECOND AS window_start, window_end FROM "
                "TABLE(TUMBLE(TABLE clicks",
            ),
            r"window_start \+ INTERVAL '1' SECOND AS window_start at line 9, column \d+ computes with the windows of "
            r"TUMBLE\(…\)",
        ),
    ],
)
def test_window_join_mistakes(query: str, message: str) -> None:
    with pytest.raises(SqlError, match=message):
        planned(query)


def duckdb_window_join(clicks: Path, buys: Path, how: str) -> pd.DataFrame:
    bucket = "time_bucket(INTERVAL 1 MINUTE, {t})"
    windows = f"{bucket} AS window_start, {bucket} + INTERVAL 1 MINUTE AS window_end"
    return duckdb.sql(
        f"WITH L AS (SELECT *, {windows.format(t='ts')} FROM '{clicks}/*.parquet'), "
        f"R AS (SELECT *, {windows.format(t='bt')} FROM '{buys}/*.parquet') "
        "SELECT L.user_id, L.page, L.ts, R.price, R.bt, coalesce(L.window_start, R.window_start) AS window_start, "
        f"coalesce(L.window_end, R.window_end) AS window_end FROM L {how} R ON L.user_id = R.uid AND "
        "L.window_start = R.window_start"
    ).df()


@pytest.mark.jvm
@pytest.mark.parametrize("how", ["JOIN", "FULL JOIN"])
def test_bounded_window_join_equals_duckdb(tmp_path: Path, how: str) -> None:
    """keyflow's window columns are the join's (never null on a padded row, where Flink's
    ``L.window_start`` is): DuckDB's ``coalesce(L.window_start, R.window_start)``."""
    clicks, buys = inputs(tmp_path, files=1)
    pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, "spark.sql.session.timeZone": "UTC"})
    pipeline.sql(TABLES.format(clicks=clicks, buys=buys, watch="", sink="blackhole", out="")
                 + WINDOW_SINK.format(path=tmp_path / "windowed")
                 + f"INSERT INTO windowed {WINDOW_JOIN.format(how=how)};")  # fmt: skip
    pipeline.run()
    same_rows(read_output(tmp_path / "windowed"), duckdb_window_join(clicks, buys, how))


@pytest.mark.jvm
def test_streamed_window_join_over_micro_batches_equals_duckdb(tmp_path: Path) -> None:
    clicks, buys = inputs(tmp_path, files=3)
    config = {**TEST_SPARK, "spark.sql.session.timeZone": "UTC", "execution.checkpointing.interval": "0 s"}
    pipeline = Pipeline(parallelism=2, config=config)
    watch = ", 'source.watch' = 'true', 'source.max-files-per-batch' = '1'"
    pipeline.sql(TABLES.format(clicks=clicks, buys=buys, watch=watch, sink="blackhole", out="")
                 + WINDOW_SINK.format(path=tmp_path / "windowed")
                 + f"INSERT INTO windowed {WINDOW_JOIN.format(how='JOIN')};")  # fmt: skip
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 3
    same_rows(read_output(tmp_path / "windowed"), duckdb_window_join(clicks, buys, "JOIN"))


USERS = (
    "CREATE TABLE users (uid STRING, tier STRING) WITH ('connector' = 'filesystem', 'path' = '{path}', "
    "'format' = 'csv');\n"
)
PROC_CLICKS = (
    "CREATE TABLE pclicks (user_id STRING, page STRING, ts TIMESTAMP(3), proc AS PROCTIME(), WATERMARK FOR ts AS "
    "ts - INTERVAL '5' SECOND) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet'{watch});\n"
)
LOOKUP = (
    "SELECT c.user_id, c.page, u.tier FROM pclicks c {how} users FOR SYSTEM_TIME AS OF c.proc AS u ON c.user_id = u.uid"
)


def lookup_plan(query: str, watch: str = "") -> Pipeline:
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    pipeline.sql(
        PROC_CLICKS.format(path="/tmp/c", watch=watch) + USERS.format(path="/tmp/u") + "CREATE TABLE enriched "
        f"(user_id STRING, page STRING, tier STRING) WITH ('connector' = 'blackhole');\nINSERT INTO enriched {query};"
    )
    return pipeline


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            LOOKUP.format(how="RIGHT JOIN"),
            r"RIGHT JOIN … FOR SYSTEM_TIME AS OF at line 4, column \d+: a lookup join is INNER or LEFT",
        ),
        (
            LOOKUP.format(how="JOIN").replace("AS OF c.proc", "AS OF c.ts"),
            r"FOR SYSTEM_TIME AS OF c.ts at line 4, column \d+: it is not a PROCTIME\(\) column of the stream here",
        ),
        (
            "SELECT uid, tier, tier FROM users FOR SYSTEM_TIME AS OF PROCTIME()",
            r"FOR SYSTEM_TIME AS OF at line 4, column \d+ is for the table a JOIN looks up",
        ),
        (
            LOOKUP.format(how="JOIN").replace("FOR SYSTEM_TIME AS OF c.proc", "FOR SYSTEM_TIME ALL"),
            r"FOR SYSTEM_TIME ALL at line 4, column \d+ is not supported; keyflow joins a table FOR SYSTEM_TIME AS OF",
        ),
        (
            "SELECT user_id, page, CAST(rn AS STRING) FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER "
            "BY proc) AS rn FROM pclicks) WHERE rn = 1",
            r"ROW_NUMBER\(\) OVER \(… ORDER BY proc\) at line 4, column \d+: a Top-N or deduplication by processing "
            r"time is not supported",
        ),
        (
            "SELECT user_id, page, CAST(rn AS STRING) FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, "
            "window_end ORDER BY page) AS rn FROM TABLE(TUMBLE(TABLE pclicks, DESCRIPTOR(proc), INTERVAL '1' "
            "MINUTE))) WHERE rn <= 1",
            r"TUMBLE\(…, DESCRIPTOR\(proc\), …\) at line 4, column \d+: proc is a PROCTIME\(\) column; keyflow runs "
            r"processing-time windows as window aggregations \(GROUP BY window_start, window_end\), not in a window "
            r"Top-N",
        ),
    ],
)
def test_temporal_join_mistakes(query: str, message: str) -> None:
    with pytest.raises(SqlError, match=message):
        lookup_plan(query)


def test_a_join_as_of_processing_time_is_a_lookup_join() -> None:
    """A PROCTIME() column of the DDL (or of a derived table, as Nexmark q13) passes through a
    projection; the join reads the table as it is at each micro-batch."""
    for query in (
        LOOKUP.format(how="LEFT JOIN"),
        LOOKUP.format(how="JOIN").replace("FROM pclicks c", "FROM (SELECT user_id, page, proc FROM pclicks) c"),
        LOOKUP.format(how="JOIN").replace("FROM pclicks c", "FROM (SELECT user_id, page, PROCTIME() AS p FROM "
                                          "pclicks) c").replace("AS OF c.proc", "AS OF c.p"),
    ):  # fmt: skip
        (join,) = [n for n in lookup_plan(query).operators.values() if isinstance(n, LookupJoinNode)]
        assert join.how in ("inner", "left")


@pytest.mark.jvm
def test_a_lookup_join_over_micro_batches_equals_duckdb(tmp_path: Path) -> None:
    """Clicks streamed in three micro-batches, each enriched with the users' tiers (a CSV table
    read whole at each micro-batch); a LEFT lookup join keeps clicks of unknown users."""
    clicks, _ = inputs(tmp_path, files=3)
    users = tmp_path / "users"
    users.mkdir()
    pd.DataFrame({"uid": [f"u{n}" for n in range(0, 40, 3)], "tier": [f"t{n % 4}" for n in range(0, 40, 3)]}).to_csv(
        users / "part-0.csv", index=False
    )
    config = {**TEST_SPARK, "execution.checkpointing.interval": "0 s"}
    pipeline = Pipeline(parallelism=2, config=config)
    watch = ", 'source.watch' = 'true', 'source.max-files-per-batch' = '1'"
    pipeline.sql(
        PROC_CLICKS.format(path=clicks, watch=watch) + USERS.format(path=users) + "CREATE TABLE enriched (user_id "
        f"STRING, page STRING, tier STRING) WITH ('connector' = 'filesystem', 'path' = '{tmp_path / 'enriched'}', "
        f"'format' = 'parquet');\nINSERT INTO enriched {LOOKUP.format(how='LEFT JOIN')};"
    )
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 3
    expected = duckdb.sql(
        f"SELECT c.user_id, c.page, u.tier FROM '{clicks}/*.parquet' c LEFT JOIN read_csv('{users}/*.csv', header = "
        "true) u ON c.user_id = u.uid"
    ).df()
    got = read_output(tmp_path / "enriched")
    assert got["tier"].isna().any()  # clicks of users the table does not have
    assert got["tier"].notna().any()
    same_rows(got, expected)


@pytest.mark.parametrize(
    ("condition", "between"),
    [
        ("b.bt BETWEEN c.ts + INTERVAL -'10' SECOND AND c.ts + INTERVAL '20' SECOND", (-10 * SECOND, 20 * SECOND)),
        ("b.bt BETWEEN c.ts + INTERVAL '-10' SECOND AND c.ts - INTERVAL '-20' SECOND", (-10 * SECOND, 20 * SECOND)),
        ("c.ts = b.bt", (0, 0)),  # one equality of the times: Flink's interval join, not a key
        ("c.ts = b.bt + INTERVAL '1' SECOND", (-SECOND, -SECOND)),
    ],
)
def test_negative_intervals_and_time_equalities_bound_an_interval_join(
    condition: str, between: tuple[int, int]
) -> None:
    (join,) = joins(condition)
    assert isinstance(join, IntervalJoinNode)
    assert (join.lower, join.upper) == between
    assert len(join.keys) == 1  # the user id only


def test_empty_time_bounds_are_an_error() -> None:
    with pytest.raises(SqlError, match=r"JOIN at line 8, column \d+: its time condition keeps no pair \(right time - "
                                       r"left time from 60000000 to 0 us\); swap the bounds"):  # fmt: skip
        joins("b.bt BETWEEN c.ts + INTERVAL '1' MINUTE AND c.ts")


def test_a_time_condition_of_a_window_join_filters_its_pairs() -> None:
    """After a window table function the times are plain columns (as in Flink): a condition on
    them filters the window join's pairs (an outer window join takes none)."""
    extra = " AND R.bt BETWEEN L.ts AND L.ts + INTERVAL '10' SECOND"
    pipeline = planned(WINDOW_JOIN.format(how="JOIN") + extra)
    assert any(isinstance(n, WindowJoinNode) for n in pipeline.operators.values())
    assert "condition=bt BETWEEN ts AND ts + INTERVAL '10' SECOND" in pipeline.plan().render()
    with pytest.raises(SqlError, match=r"FULL JOIN at line 9, column \d+: the condition R.bt BETWEEN"):
        planned(WINDOW_JOIN.format(how="FULL JOIN") + extra)


WINDOWED_VIEWS = (
    "CREATE VIEW lv AS SELECT user_id, page, window_start, window_end FROM TABLE(TUMBLE(TABLE clicks, "
    "DESCRIPTOR(ts), INTERVAL '1' MINUTE));\n"
    "CREATE VIEW rv AS SELECT uid AS user_id, price, window_start, window_end FROM TABLE(TUMBLE(TABLE buys, "
    "DESCRIPTOR(bt), INTERVAL '1' MINUTE));\n"
)
VIEWS_JOIN = (
    "SELECT L.user_id, L.page, CAST(NULL AS TIMESTAMP(3)), R.price, CAST(NULL AS TIMESTAMP(3)), L.window_start, "
    "L.window_end FROM lv L JOIN rv R ON L.user_id = R.user_id AND L.window_start = R.window_start AND "
    "L.window_end = R.window_end"
)


def test_windowed_views_and_derived_tables_without_their_time_column_window_join() -> None:
    views, query = WINDOWED_VIEWS, VIEWS_JOIN
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    script = TABLES.format(clicks="/tmp/c", buys="/tmp/b", watch="", sink="blackhole", out="")
    pipeline.sql(script + views + WINDOW_SINK.format(path="/tmp/w") + f"INSERT INTO windowed {query};")
    (join,) = [n for n in pipeline.operators.values() if isinstance(n, JoinNode)]
    assert isinstance(join, WindowJoinNode)
    assert join.time_columns[0] != join.time_columns[1]  # hidden, one name per table
    with pytest.raises(SqlError, match=r"TUMBLE\(…\) at line 8, column \d+ is read without GROUP BY window_start"):
        Pipeline(parallelism=2, config=TEST_SPARK).sql(
            script + views + WINDOW_SINK.format(path="/tmp/w") + "INSERT INTO windowed SELECT user_id, page, "
            "CAST(NULL AS TIMESTAMP(3)), 1.0, CAST(NULL AS TIMESTAMP(3)), window_start, window_end FROM lv;"
        )


@pytest.mark.jvm
def test_a_window_join_of_views_that_drop_the_time_column_equals_duckdb(tmp_path: Path) -> None:
    clicks, buys = inputs(tmp_path, files=1)
    pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, "spark.sql.session.timeZone": "UTC"})
    pipeline.sql(TABLES.format(clicks=clicks, buys=buys, watch="", sink="blackhole", out="") + WINDOWED_VIEWS
                 + WINDOW_SINK.format(path=tmp_path / "windowed") + f"INSERT INTO windowed {VIEWS_JOIN};")  # fmt: skip
    pipeline.run()
    expected = duckdb_window_join(clicks, buys, "JOIN").assign(ts=pd.NaT, bt=pd.NaT)
    same_rows(read_output(tmp_path / "windowed"), expected)


def test_a_proctime_column_passes_a_lookup_join_to_the_next() -> None:
    """Flink's chained lookup joins: each AS OF the stream's PROCTIME() column."""
    query = (
        "SELECT c.user_id, c.page, u2.tier FROM pclicks c JOIN users FOR SYSTEM_TIME AS OF c.proc AS u ON "
        "c.user_id = u.uid JOIN users FOR SYSTEM_TIME AS OF c.proc AS u2 ON u.tier = u2.uid"
    )
    assert len([n for n in lookup_plan(query).operators.values() if isinstance(n, LookupJoinNode)]) == 2


def test_a_watermark_on_a_proctime_column_is_refused() -> None:
    with pytest.raises(SqlError, match=r"table 'pclicks': WATERMARK FOR proc declares event time on a PROCTIME\(\) "
                                       r"column"):  # fmt: skip
        lookup_plan(LOOKUP.format(how="JOIN")).sql(
            PROC_CLICKS.replace("WATERMARK FOR ts AS ts", "WATERMARK FOR proc AS proc").format(path="/x", watch="")
        )


def test_an_equality_of_the_times_alone_stays_a_key_as_before() -> None:
    """With no other key there is no interval join (keyflow keys every join): the times are the key."""
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    script = TABLES.format(clicks="/tmp/c", buys="/tmp/b", watch="", sink="blackhole", out="")
    pipeline.sql(script + "INSERT INTO out SELECT c.user_id, c.page, c.ts, b.price, b.bt FROM clicks c JOIN buys b "
                 "ON c.ts = b.bt;")  # fmt: skip
    (join,) = [n for n in pipeline.operators.values() if isinstance(n, JoinNode)]
    assert type(join) is JoinNode


def test_a_windowed_view_joined_with_itself() -> None:
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    script = TABLES.format(clicks="/tmp/c", buys="/tmp/b", watch="", sink="blackhole", out="")
    pipeline.sql(script + WINDOWED_VIEWS + WINDOW_SINK.format(path="/tmp/w") + "INSERT INTO windowed SELECT "
                 "L.user_id, L.page, CAST(NULL AS TIMESTAMP(3)), 1.0, CAST(NULL AS TIMESTAMP(3)), L.window_start, "
                 "L.window_end FROM lv L JOIN lv R ON L.user_id = R.user_id AND L.window_start = R.window_start AND "
                 "L.window_end = R.window_end;")  # fmt: skip
    (join,) = [n for n in pipeline.operators.values() if isinstance(n, WindowJoinNode)]
    assert join.time_columns[0] != join.time_columns[1]
