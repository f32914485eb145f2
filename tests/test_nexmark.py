"""The Nexmark queries as Flink's Nexmark repository publishes them (bench/nexmark_sql), run
by keyflow over its ``nexmark`` source, each answer compared with DuckDB computing the query
with Flink's meanings over the same events (which the job also writes out).

One bounded job runs every query keyflow supports beside an events sink, so the module
pays for one Spark job graph. The rest are refused at plan time, each naming its construct.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from bench import nexmark_sql
from keyflow import Pipeline
from keyflow.changelog import OP, current
from keyflow.cli.app import app
from keyflow.runtime.streaming import FAULT_ENV
from keyflow.sql.errors import SqlError
from tests.pipelines import TEST_SPARK

ROOT = Path(__file__).resolve().parents[1]

SPARK = {**TEST_SPARK, "spark.sql.session.timeZone": "UTC"}  # Flink's TIMESTAMP(3) has no zone: UTC as DuckDB
EVENTS, RATE = 20_000, 200  # 100 s of event time: ten 10 s windows, sessions that end and start
EVENTS_SINK = """
CREATE TABLE events (event_type INT, person ROW<id BIGINT, name VARCHAR, emailAddress VARCHAR, creditCard VARCHAR,
  city VARCHAR, state VARCHAR, `dateTime` TIMESTAMP(3), extra VARCHAR>, auction ROW<id BIGINT, itemName VARCHAR,
  description VARCHAR, initialBid BIGINT, reserve BIGINT, `dateTime` TIMESTAMP(3), expires TIMESTAMP(3),
  seller BIGINT, category BIGINT, extra VARCHAR>, bid ROW<auction BIGINT, bidder BIGINT, price BIGINT,
  channel VARCHAR, url VARCHAR, `dateTime` TIMESTAMP(3), extra VARCHAR>, `dateTime` TIMESTAMP(3))
WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet');
INSERT INTO events SELECT event_type, person, auction, bid, `dateTime` FROM datagen;
"""
VIEWS = """
SET TimeZone = 'UTC';
CREATE VIEW person AS SELECT person.id AS id, person.name AS name, person.emailAddress AS emailAddress,
  person.creditCard AS creditCard, person.city AS city, person.state AS state, "dateTime", person.extra AS extra
  FROM events WHERE event_type = 0;
CREATE VIEW auction AS SELECT auction.id AS id, auction.itemName AS itemName, auction.description AS description,
  auction.initialBid AS initialBid, auction.reserve AS reserve, "dateTime", auction.expires AS expires,
  auction.seller AS seller, auction.category AS category, auction.extra AS extra FROM events WHERE event_type = 1;
CREATE VIEW bid AS SELECT bid.auction AS auction, bid.bidder AS bidder, bid.price AS price, bid.channel AS channel,
  bid.url AS url, "dateTime", bid.extra AS extra FROM events WHERE event_type = 2;
CREATE VIEW hop AS SELECT b.*, s AS window_start, s + INTERVAL 10 SECOND AS window_end FROM bid b,
  unnest(generate_series(time_bucket(INTERVAL 2 SECOND, "dateTime") - INTERVAL 8 SECOND,
                         time_bucket(INTERVAL 2 SECOND, "dateTime"), INTERVAL 2 SECOND)) AS t(s);
"""
COUNTS = """count(*) AS total_bids,
  count(*) FILTER (WHERE price < 10000), count(*) FILTER (WHERE price >= 10000 AND price < 1000000),
  count(*) FILTER (WHERE price >= 1000000)"""
DISTINCTS = ", ".join(
    f"count(DISTINCT {column}) FILTER (WHERE {condition})"
    for column in ("bidder", "auction")
    for condition in ("true", "price < 10000", "price >= 10000 AND price < 1000000", "price >= 1000000")
)
# Each query as DuckDB computes it with Flink's meanings (the sink's column order).
REFERENCES = {
    "q0": "SELECT auction, bidder, price, dateTime, extra FROM bid",
    "q1": "SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)), dateTime, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": "SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id "
    "WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')",
    "q4": "SELECT category, CAST(trunc(avg(final)) AS BIGINT) FROM (SELECT max(B.price) AS final, A.category "
    "FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires "
    "GROUP BY A.id, A.category) GROUP BY category",
    "q5": "WITH c AS (SELECT auction, window_start, count(*) AS num FROM hop GROUP BY ALL), "
    "m AS (SELECT window_start, max(num) AS maxn FROM c GROUP BY ALL) "
    "SELECT c.auction, c.num FROM c JOIN m USING (window_start) WHERE c.num >= m.maxn",
    "q7": "WITH w AS (SELECT max(price) AS maxprice, time_bucket(INTERVAL 10 SECOND, dateTime) "
    "+ INTERVAL 10 SECOND AS dateTime FROM bid GROUP BY ALL) SELECT B.auction, B.price, B.bidder, B.dateTime, "
    "B.extra FROM bid B JOIN w ON B.price = w.maxprice "
    "WHERE B.dateTime BETWEEN w.dateTime - INTERVAL 10 SECOND AND w.dateTime",
    "q8": "SELECT DISTINCT P.id, P.name, time_bucket(INTERVAL 10 SECOND, P.dateTime) FROM person P JOIN auction A "
    "ON P.id = A.seller AND time_bucket(INTERVAL 10 SECOND, P.dateTime) = time_bucket(INTERVAL 10 SECOND, "
    "A.dateTime)",
    "q9": "SELECT * EXCLUDE (rownum) FROM (SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime, "
    "B.extra AS bid_extra, row_number() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime) AS rownum "
    "FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires) WHERE rownum <= 1",
    "q10": "SELECT auction, bidder, price, dateTime, extra, strftime(dateTime, '%Y-%m-%d'), "
    "strftime(dateTime, '%H:%M') FROM bid",
    "q11": "WITH s AS (SELECT bidder, dateTime, sum(CASE WHEN dateTime - previous < INTERVAL 10 SECOND THEN 0 "
    "ELSE 1 END) OVER (PARTITION BY bidder ORDER BY dateTime) AS session FROM (SELECT bidder, dateTime, "
    "lag(dateTime) OVER (PARTITION BY bidder ORDER BY dateTime) AS previous FROM bid)) "
    "SELECT bidder, count(*), min(dateTime), max(dateTime) + INTERVAL 10 SECOND FROM s GROUP BY bidder, session",
    "q12": "SELECT bidder, count(*) FROM bid GROUP BY bidder",  # one processing time: one window each (WALL_CLOCK)
    "q13": "SELECT B.auction, B.bidder, B.price, B.dateTime, S.value FROM bid B JOIN side_input S "
    "ON B.auction % 10000 = S.key",
    "q14": "SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)), CASE WHEN hour(dateTime) >= 8 AND "
    "hour(dateTime) <= 18 THEN 'dayTime' WHEN hour(dateTime) <= 6 OR hour(dateTime) >= 20 THEN 'nightTime' "
    "ELSE 'otherTime' END, dateTime, extra, length(extra) - length(replace(extra, 'c', '')) FROM bid "
    "WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000",
    "q15": f"SELECT strftime(dateTime, '%Y-%m-%d'), {COUNTS}, {DISTINCTS} FROM bid GROUP BY ALL",
    "q16": f"SELECT channel, strftime(dateTime, '%Y-%m-%d'), max(strftime(dateTime, '%H:%M')), {COUNTS}, "
    f"{DISTINCTS} FROM bid GROUP BY channel, strftime(dateTime, '%Y-%m-%d')",
    "q17": f"SELECT auction, strftime(dateTime, '%Y-%m-%d'), {COUNTS}, min(price), max(price), "
    "CAST(trunc(avg(price)) AS BIGINT), sum(price) FROM bid GROUP BY auction, strftime(dateTime, '%Y-%m-%d')",
    "q18": "SELECT auction, bidder, price, channel, url, dateTime, extra FROM (SELECT *, row_number() OVER "
    "(PARTITION BY bidder, auction ORDER BY dateTime DESC) AS rn FROM bid) WHERE rn <= 1",
    "q19": "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number "
    "FROM bid) WHERE rank_number <= 10",
    "q20": "SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.dateTime, B.extra, A.itemName, A.description, "
    "A.initialBid, A.reserve, A.dateTime, A.expires, A.seller, A.category, A.extra FROM bid B "
    "JOIN auction A ON B.auction = A.id WHERE A.category = 10",
    "q21": "SELECT auction, bidder, price, channel, CASE WHEN lower(channel) = 'apple' THEN '0' "
    "WHEN lower(channel) = 'google' THEN '1' WHEN lower(channel) = 'facebook' THEN '2' "
    "WHEN lower(channel) = 'baidu' THEN '3' ELSE (CASE WHEN regexp_matches(url, '(&|^)channel_id=([^&]*)') "
    "THEN regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END) END FROM bid "
    "WHERE regexp_matches(url, '(&|^)channel_id=([^&]*)') OR lower(channel) IN ('apple', 'google', 'facebook', "
    "'baidu')",
    "q22": "SELECT auction, bidder, price, channel, string_split(url, '/')[4], string_split(url, '/')[5], "
    "string_split(url, '/')[6] FROM bid",
}


JAVA_COUNT_CHAR = "CREATE FUNCTION count_char AS 'com.github.nexmark.flink.udf.CountChar';"
PYTHON_COUNT_CHAR = "CREATE FUNCTION count_char AS 'tests.udfs.count_char' LANGUAGE PYTHON;"  # q14's, in Python
# insert-only, a join, aggregates of a join, retracting aggregates, Top-N of a join, deduplication, Top-N numbered,
# a lookup join, partitioned files, then the other stateless and GROUP BY queries. Not the windowed ones (q5, q7,
# q8, q11, q12): a stream's last windows wait for a watermark past them, so its table holds fewer windows than the
# bounded job's
STREAMED = ("q1", "q3", "q4", "q17", "q20", "q9", "q18", "q19", "q13", "q10", "q0", "q2", "q15", "q16", "q21", "q22")
# Windowed queries streamed too, compared on the windows the stream's final watermark passed: by the
# answer's column (position, seconds from it to the window's end) that dates each row's window.
CLOSED = {"q8": (2, 10), "q11": (3, 0)}
# Windowed queries whose answer names no window, streamed too: DuckDB's answer of the windows the
# final watermark passed (the condition added to the query's last WHERE). q5 joins the windows'
# counts with their GROUP BY maximum, an updating table (a join of changelogs).
CLOSED_WINDOWS = {
    "q5": " AND c.window_start + INTERVAL 10 SECOND - INTERVAL 1 MICROSECOND <= '{watermark}'",
    "q7": " AND w.dateTime - INTERVAL 1 MICROSECOND <= '{watermark}'",
}
# Top-N queries whose order has ties in these events: which of the tied rows is kept is not fixed (in Flink
# neither), so they are compared by these columns, and each row kept must be one of the query's input rows.
TIES = {"q19": ("SELECT * FROM bid", ["auction", "price", "rank_number"])}
# Queries windowed by processing time: their windows are the wall clock's, so they are compared
# by the other columns, and each window must be 10 s that held the run's processing time.
WALL_CLOCK = {"q12": (["bidder", "bid_count"], "starttime", "endtime")}


@pytest.fixture(scope="module")
def nexmark_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every supported query in one bounded job over the same events, which it also writes."""
    out = tmp_path_factory.mktemp("nexmark")
    nexmark_sql.side_input(out / "side_input")
    script = nexmark_sql.source(EVENTS, RATE) + EVENTS_SINK.format(path=out / "events")
    script += "".join(nexmark_sql.query(name, out) for name in nexmark_sql.RUNNABLE)
    script += nexmark_sql.query("q14", out).replace(JAVA_COUNT_CHAR, PYTHON_COUNT_CHAR)
    pipeline = Pipeline(parallelism=2, config=SPARK)
    pipeline.sql(script)
    pipeline.run()
    return out


def test_every_query_is_run_or_refused_before_spark() -> None:
    assert set(REFERENCES) == {*nexmark_sql.RUNNABLE, "q14"}  # q14 with its function in Python
    assert JAVA_COUNT_CHAR in nexmark_sql.query("q14")
    for name, construct in nexmark_sql.UNSUPPORTED.items():
        with pytest.raises(SqlError) as refused:
            Pipeline(parallelism=2, config=TEST_SPARK).sql(nexmark_sql.source(10, 1) + nexmark_sql.query(name))
        assert str(refused.value).startswith(f"{construct} at line "), (name, refused.value)


@pytest.mark.jvm
@pytest.mark.parametrize("name", sorted(REFERENCES, key=lambda q: int(q[1:])))
def test_query_equals_duckdb(nexmark_run: Path, name: str) -> None:
    output = _output(nexmark_run / f"nexmark_{name}")
    assert_answer(nexmark_run, name, current(output) if OP in output.column_names else output)


@pytest.mark.jvm
def test_q10_writes_partitions_as_published_and_commits_each_at_the_end(nexmark_run: Path) -> None:
    """q10's sink as Nexmark publishes it: CSV files under ``dt=…/hm=…`` (``:`` escaped, as Flink
    and Spark escape it), the rows equal DuckDB's (above); a bounded job's end commits every
    partition, so each holds its ``_SUCCESS`` file (Flink's ``success-file`` policy)."""
    partitions = _partitions(nexmark_run / "nexmark_q10")
    minutes = _rows(_duckdb(nexmark_run, "q10").select([5, 6]))
    assert partitions == {f"dt={day}/hm={minute.replace(':', '%3A')}" for day, minute in minutes}
    assert len(partitions) == 2  # 100 s of events from 00:00
    assert all((nexmark_run / "nexmark_q10" / partition / "_SUCCESS").is_file() for partition in partitions)


@pytest.mark.jvm
def test_streamed_queries_survive_a_kill_and_a_restart_at_another_parallelism(
    nexmark_run: Path, tmp_path: Path
) -> None:
    """The same events as a stream (``rate.limited``) in micro-batches of 10,000: the driver is
    killed with SIGKILL after its first commit, restarted at parallelism 3; each query's
    current table equals DuckDB's answer, as the bounded job's does."""
    out = tmp_path / "out"
    nexmark_sql.side_input(out / "side_input")
    script = nexmark_sql.source(EVENTS, RATE).replace(
        "'connector' = 'nexmark',", "'connector' = 'nexmark', 'rate.limited' = 'true', 'scan.rows-per-batch' = '10000',"
    )
    queries = [*STREAMED, *CLOSED, *CLOSED_WINDOWS]
    script = "SET 'pipeline.progress' = 'off';\n" + script + "".join(nexmark_sql.query(q, out) for q in queries)
    (tmp_path / "job.sql").write_text(script)
    command = [sys.executable, "-m", "keyflow", "sql", str(tmp_path / "job.sql"), "-p", "2", "--checkpoint",
               str(tmp_path / "ckpt"), "--available-now", "--conf", "spark.master=local[2]", "--conf",
               "spark.sql.session.timeZone=UTC"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), FAULT_ENV: "after-commit:0"}
    crashed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    resumed = CliRunner().invoke(
        app, ["sql", str(tmp_path / "job.sql"), "-p", "3", "--checkpoint", str(tmp_path / "ckpt"), "--available-now"]
    )
    assert resumed.exit_code == 0, resumed.output
    assert "parallelism 3" in resumed.stdout
    for name in STREAMED:
        output = _output(out / f"nexmark_{name}")
        assert_answer(nexmark_run, name, current(output) if OP in output.column_names else output)
    # The watermark the stream ends at: the largest event time less Nexmark's 4 s (and 1 µs).
    events = pq.read_table(nexmark_run / "events", columns=["dateTime"]).column(0).to_pandas()
    watermark = events.max() - pd.Timedelta(seconds=4) - pd.Timedelta(microseconds=1)
    for name, (position, to_end) in CLOSED.items():
        output = _output(out / f"nexmark_{name}")
        columns = ", ".join(f"c{i}" for i in range(output.num_columns))
        closed = (f"FROM ({REFERENCES[name]}) AS answer({columns}) WHERE c{position} + INTERVAL {to_end} SECOND "
                  f"- INTERVAL 1 MICROSECOND <= '{watermark}'")  # fmt: skip
        assert len(_duckdb(nexmark_run, name, closed)) < len(_duckdb(nexmark_run, name)), f"{name}: all closed"
        assert_answer(nexmark_run, name, output, closed)
    for name, condition in CLOSED_WINDOWS.items():
        output = _output(out / f"nexmark_{name}")
        closed = REFERENCES[name] + condition.format(watermark=watermark)
        assert len(_duckdb(nexmark_run, name, closed)) < len(_duckdb(nexmark_run, name)), f"{name}: all closed"
        assert_answer(nexmark_run, name, current(output) if OP in output.column_names else output, closed)
    # q10's 'partition-time' trigger commits a minute's partition once the watermark is past its
    # minute's end plus the 1 min delay.
    partitions = _partitions(out / "nexmark_q10")
    committed = {p for p in partitions if (out / "nexmark_q10" / p / "_SUCCESS").is_file()}
    times = {p: pd.Timestamp(p[3:13] + " " + p[-7:].replace("%3A", ":")) for p in partitions}
    assert committed == {p for p in partitions if watermark > times[p] + pd.Timedelta(minutes=1)}
    assert committed, "no partition committed: the check would prove nothing"
    assert committed != partitions  # the last minute stays open


def assert_answer(run: Path, name: str, table: pa.Table, query: str | None = None) -> None:
    """``table`` is DuckDB's answer to query ``name`` (or to ``query``; up to the choice among
    tied rows, see ``TIES``)."""
    reference = _duckdb(run, name, query)
    if name in WALL_CLOCK:
        columns, start, end = WALL_CLOCK[name]
        starts, ends = (table.column(c).to_pandas() for c in (start, end))
        assert ((ends - starts) == pd.Timedelta(seconds=10)).all(), name
        assert starts.nunique() == 1, name  # a bounded run's rows are all processed at one time
        now = pd.Timestamp.now(tz="UTC").tz_localize(None)
        assert now - pd.Timedelta(hours=1) < starts.iloc[0] <= now, name  # the run's clock (UTC), not event time
        table = table.select(columns)
    got, expected = _rows(table), _rows(reference)
    assert got, f"{name} gave no rows on these events: the comparison would prove nothing"
    assert len(got) == len(expected), (name, len(got), len(expected))
    if name not in TIES:
        assert got == expected, name
        return
    inputs, columns = TIES[name]
    assert _rows(table.select(columns)) == _rows(reference.select(columns)), name
    candidates = _duckdb(run, name, inputs)
    kept = table.select([column for column in table.column_names if column in candidates.column_names])
    assert set(_rows(kept)) <= set(_rows(candidates)), name


@pytest.mark.jvm
def test_events_follow_nexmarks_arithmetic(nexmark_run: Path) -> None:
    """What Nexmark fixes by the event number, computed here in plain Python from its
    GeneratorConfig and generators: the kind, the person or auction an event creates, the
    time, hot bidders and auctions within Nexmark's bounds, the channel ids."""
    events = pq.read_table(nexmark_run / "events").to_pandas()
    events["n"] = ((events["dateTime"] - pd.Timestamp("2026-01-01")) / pd.Timedelta(milliseconds=1000 / RATE)).round()
    events = events.sort_values("n").reset_index(drop=True)
    assert events["n"].tolist() == list(range(EVENTS))
    person, auction, bids = 1, 3, 46
    for n, row in events.iloc[:500].iterrows():
        epoch, offset = divmod(n, person + auction + bids)
        kind = 0 if offset < person else 1 if offset < person + auction else 2
        assert row["event_type"] == kind, n
        last_person = epoch * person + min(offset, person - 1)
        if offset < person:
            last_auction = (epoch - 1) * auction + auction - 1
        elif offset >= person + auction:
            last_auction = epoch * auction + auction - 1
        else:
            last_auction = epoch * auction + offset - person
        if kind == 0:
            assert row["person"]["id"] == 1000 + last_person
        elif kind == 1:
            assert row["auction"]["id"] == 1000 + last_auction
            assert 10 <= row["auction"]["category"] < 15
            assert row["auction"]["reserve"] >= row["auction"]["initialBid"]
        else:
            bid = row["bid"]
            hot_auction = 1000 + last_auction // 100 * 100
            newest = max(last_auction - 100, 0)
            assert bid["auction"] == hot_auction or 1000 + newest <= bid["auction"] <= 1000 + last_auction + 10, n
            hot_bidder = 1000 + last_person // 100 * 100 + 1
            assert bid["bidder"] == hot_bidder or bid["bidder"] <= 1000 + last_person + 10, n
    bids_only = pd.DataFrame(list(events.loc[events["event_type"] == 2, "bid"]))
    ids = bids_only["url"].str.extract(r"channel_id=(-?\d+)")[0].dropna().astype("int64")
    numbers = bids_only.loc[ids.index, "channel"].str.removeprefix("channel-").astype("int64")
    assert ids.tolist() == [abs(_java_reverse(int(number))) for number in numbers]
    assert 0.85 < len(ids) / (~bids_only["channel"].isin(["Google", "Facebook", "Baidu", "Apple"])).sum() < 0.95


def _java_reverse(value: int) -> int:
    """Java's Integer.reverse, as a signed int."""
    bits = int(f"{value:032b}"[::-1], 2)
    return bits - (1 << 32) if bits >= 1 << 31 else bits


def _duckdb(run: Path, name: str, query: str | None = None) -> pa.Table:
    """Query ``name`` (or ``query``) as DuckDB computes it over the events ``run`` wrote."""
    con = duckdb.connect()
    con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet('{run / 'events'}/*.parquet')")
    con.execute(f"CREATE VIEW side_input AS SELECT * FROM read_csv('{run / 'side_input'}/*.csv', header = true, "
                "columns = {'key': 'BIGINT', 'value': 'VARCHAR'})")  # fmt: skip
    for statement in VIEWS.split(";"):
        if statement.strip():
            con.execute(statement)
    return con.sql(query or REFERENCES[name]).to_arrow_table()


def _output(directory: Path) -> pa.Table:
    """A query's output files: Parquet, or q10's partitioned CSV (its partition values read back
    from the directory names)."""
    if directory.name == "nexmark_q10":
        return ds.dataset(directory, format="csv", partitioning="hive").to_table()
    return pa.concat_tables(_tables(directory))


def _partitions(directory: Path) -> set[str]:
    return {str(path.parent.relative_to(directory)) for path in directory.rglob("part-*")}


def _tables(directory: Path) -> list[pa.Table]:
    tables = [pq.read_table(path) for path in sorted(directory.rglob("part-*"))]
    assert tables, f"no output in {directory}"
    return tables


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples of comparable values (instants in UTC, decimals as floats)."""
    frame = table.drop_columns([OP]) if OP in table.column_names else table
    rows = []
    for row in frame.to_pandas().itertuples(index=False):
        rows.append(tuple(_value(value) for value in row))
    return sorted(rows, key=repr)


def _value(value: Any) -> Any:
    if isinstance(value, pd.Timestamp):
        return (value.tz_convert("UTC") if value.tzinfo else value.tz_localize("UTC")).isoformat()
    if isinstance(value, Decimal):
        return round(float(value), 3)
    if isinstance(value, float) and value != value:
        return None
    return None if value is pd.NaT or value is None else value
