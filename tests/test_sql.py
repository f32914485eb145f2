"""SQL pipelines on real Spark over real files, each answer compared with DuckDB's on the same files."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from keyflow import Log, Pipeline
from keyflow.changelog import current
from keyflow.cli.app import app
from keyflow.sql.errors import SqlError
from tests.pipelines import TEST_SPARK
from tests.streams import read_output, split, write_parts

runner = CliRunner()


def write_orders(directory: Path, rows: int = 6_000, seed: int = 11) -> Path:
    """Orders in three Parquet files (users skewed, some null amounts), for Spark and DuckDB alike."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "order_id": np.arange(rows, dtype=np.int64),
            "user_id": [f"user-{n}" for n in np.minimum(rng.zipf(1.3, rows), 400)],
            "amount": np.round(rng.uniform(-20, 500, rows), 2),
            "qty": rng.integers(1, 9, rows).astype(np.int32),
            "country": rng.choice(["DE", "FR", "US", "JP"], rows),
        }
    )
    frame.loc[frame.index % 37 == 0, "amount"] = None
    write_parts(directory, split(frame, 3))
    return directory


ORDERS_DDL = """
CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, qty INT, country STRING)
WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet'{scan});
"""

PER_USER = """
SELECT user_id, COUNT(*) AS orders, SUM(amount) AS revenue, AVG(amount) AS mean, MIN(qty) AS smallest,
       MAX(amount) AS largest, COUNT(DISTINCT country) AS countries, SUM(qty) * 2 AS doubled
FROM orders
WHERE qty > 1
GROUP BY user_id
HAVING COUNT(*) > 2
"""


def pipeline(parallelism: int = 2, **config: object) -> Pipeline:
    return Pipeline(parallelism=parallelism, config={**TEST_SPARK, **config})


def sorted_frame(frame: pd.DataFrame, by: str) -> pd.DataFrame:
    return frame.sort_values(by).reset_index(drop=True)


@pytest.mark.jvm
@pytest.mark.parametrize("scan_parallelism", [1, 3, None])
def test_group_by_equals_duckdb_at_each_scan_parallelism(tmp_path: Path, scan_parallelism: int | None) -> None:
    files = write_orders(tmp_path / "orders")
    scan = "" if scan_parallelism is None else f", 'scan.parallelism' = '{scan_parallelism}'"
    p = pipeline()
    p.sql(
        ORDERS_DDL.format(path=files, scan=scan)
        + f"""
        CREATE TABLE per_user (user_id STRING, orders BIGINT, revenue DOUBLE, mean DOUBLE, smallest INT,
                               largest DOUBLE, countries BIGINT, doubled BIGINT)
        WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "out"}', 'format' = 'parquet');
        INSERT INTO per_user {PER_USER};
        """
    )
    graph = p.plan()
    assert graph.vertices[0].parallelism == (scan_parallelism or 2)
    assert all(v.parallelism == 2 for v in graph.vertices[1:])  # the operators keep the default
    if scan_parallelism not in (None, 2):
        assert graph.edges[0].partitioner.value == "rebalance"  # insert-only source: rebalanced
    p.run()
    got = sorted_frame(pd.read_parquet(tmp_path / "out"), "user_id")
    expected = duckdb.sql(PER_USER.replace("FROM orders", f"FROM '{files}/*.parquet'")).df()
    expected = sorted_frame(expected, "user_id")
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, rtol=1e-9)


@pytest.mark.jvm
def test_projection_and_filter_equal_duckdb_in_json_and_csv(tmp_path: Path) -> None:
    files = write_orders(tmp_path / "orders", rows=2_000)
    query = (
        "SELECT order_id, UPPER(country) AS country, amount * qty AS total, CASE WHEN qty > 4 THEN 'big' "
        "ELSE 'small' END AS size FROM orders WHERE amount IS NOT NULL AND country <> 'JP'"
    )
    p = pipeline()
    p.sql(
        ORDERS_DDL.format(path=files, scan=", 'scan.parallelism' = '3'")
        + f"""
        CREATE TABLE as_json (order_id BIGINT, country STRING, total DOUBLE, size STRING)
        WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "json"}', 'format' = 'json', 'sink.parallelism' = '1');
        CREATE TABLE as_csv (order_id BIGINT, country STRING, total DOUBLE, size STRING)
        WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "csv"}', 'format' = 'csv');
        EXECUTE STATEMENT SET BEGIN
            INSERT INTO as_json {query};
            INSERT INTO as_csv {query};
        END;
        """
    )
    graph = p.plan()
    assert sum(op.kind == "source" for op in graph.operators) == 1  # both INSERTs read one source
    p.run()
    expected = sorted_frame(duckdb.sql(query.replace("FROM orders", f"FROM '{files}/*.parquet'")).df(), "order_id")
    from_json = duckdb.sql(f"SELECT * FROM read_json_auto('{tmp_path / 'json'}/*.json')").df()
    from_csv = duckdb.sql(f"SELECT * FROM read_csv_auto('{tmp_path / 'csv'}/*.csv', header=true)").df()
    for got in (from_json, from_csv):
        pd.testing.assert_frame_equal(sorted_frame(got, "order_id"), expected, check_dtype=False, rtol=1e-9)


@pytest.mark.jvm
def test_datagen_rows_follow_the_flink_options(tmp_path: Path) -> None:
    p = pipeline()
    p.sql(
        f"""
        CREATE TABLE numbers (id BIGINT, k INT, price DOUBLE, tag STRING) WITH (
            'connector' = 'datagen', 'number-of-rows' = '5000', 'scan.parallelism' = '3',
            'fields.id.kind' = 'sequence', 'fields.id.start' = '100', 'fields.id.end' = '4099',
            'fields.k.min' = '1', 'fields.k.max' = '20', 'fields.price.min' = '5', 'fields.price.max' = '6',
            'fields.tag.length' = '4');
        CREATE TABLE out (id BIGINT, k INT, price DOUBLE, tag STRING)
        WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "out"}', 'format' = 'parquet');
        INSERT INTO out SELECT * FROM numbers;
        """
    )
    p.run()
    stats = duckdb.sql(
        f"SELECT COUNT(*), MIN(id), MAX(id), COUNT(DISTINCT id), MIN(k), MAX(k), MIN(price), MAX(price), "
        f"MAX(LENGTH(tag)), typeof(ANY_VALUE(k)) FROM '{tmp_path / 'out'}/*.parquet'"
    ).fetchall()[0]
    # The sequence ends first (Flink: the source ends with any sequence): 4,000 rows, not 5,000.
    assert stats == (4000, 100, 4099, 4000, 1, 20, pytest.approx(5, abs=0.01), pytest.approx(6, abs=0.01), 4, "INTEGER")


@pytest.mark.jvm
def test_sink_routed_by_primary_key_holds_whole_keys_per_file(tmp_path: Path) -> None:
    """table.exec.sink.keyed-shuffle AUTO: sink parallelism 3 differs from its input's 2, so
    rows reach the sink by the primary key's key group: every key is in exactly one file."""
    files = write_orders(tmp_path / "orders", rows=3_000)
    script = ORDERS_DDL.format(path=files, scan="") + (
        f"CREATE TABLE copy (order_id BIGINT, user_id STRING, PRIMARY KEY (user_id) NOT ENFORCED) WITH ("
        f"'connector' = 'filesystem', 'path' = '{tmp_path / 'out'}', 'format' = 'parquet', "
        "'sink.parallelism' = '3'); INSERT INTO copy SELECT order_id, user_id FROM orders;"
    )
    p = pipeline()
    p.sql(script)
    sink_edge = p.plan().edges[-1]
    assert (sink_edge.partitioner.value, sink_edge.keys) == ("hash", ("user_id",))
    p.run()
    parts = sorted((tmp_path / "out").glob("part-*.parquet"))
    owners: dict[str, set[int]] = {}
    for index, part in enumerate(parts):
        for user in set(pq.read_table(part).column("user_id").to_pylist()):
            owners.setdefault(user, set()).add(index)
    assert len(parts) == 3
    assert all(len(files_of_user) == 1 for files_of_user in owners.values())
    assert sum(pq.read_table(part).num_rows for part in parts) == 3_000


def sink_partitioner(mode: str, sink_parallelism: int, primary_key: bool = True, changelog: str = "") -> str:
    """The partitioner into the sink of ``INSERT INTO sink SELECT * FROM source`` (input at 2)."""
    p = pipeline(**{"table.exec.sink.keyed-shuffle": mode.lower()})
    key = ", PRIMARY KEY (user_id) NOT ENFORCED" if primary_key else ""
    p.sql(
        ORDERS_DDL.format(path="/tmp/unread", scan="")
        + f"CREATE TABLE out (user_id STRING, amount DOUBLE{key}) WITH ('connector' = 'blackhole', "
        f"'sink.parallelism' = '{sink_parallelism}'); INSERT INTO out SELECT user_id, amount FROM orders;"
    )
    (sink,) = [operator for operator in p.plan().operators if operator.kind == "sink"]
    return str(sink.input_partitioner)


# Named after Flink's TableSinkTest (CommonExecSink.applyKeyBy), input parallelism 2.
def test_append_stream_to_sink_with_pk_auto_key_by() -> None:
    assert sink_partitioner("AUTO", 3) == "hash"  # the sink's parallelism differs: keyed by its primary key


def test_append_stream_to_sink_with_pk_no_key_by() -> None:
    assert sink_partitioner("NONE", 3) == "rebalance"


def test_append_stream_to_sink_with_pk_force_key_by() -> None:
    assert sink_partitioner("FORCE", 2) == "hash"  # same parallelism, keyed all the same
    assert sink_partitioner("AUTO", 2) == "forward"


def test_single_parallelism_append_stream_to_sink_with_pk_force_key_by() -> None:
    assert sink_partitioner("FORCE", 1) == "rebalance"  # never into parallelism 1
    assert sink_partitioner("AUTO", 1) == "rebalance"


def test_append_stream_to_sink_without_pk_force_key_by() -> None:
    assert sink_partitioner("FORCE", 2, primary_key=False) == "forward"
    assert sink_partitioner("FORCE", 3, primary_key=False) == "rebalance"


@pytest.mark.jvm
def test_set_configures_the_job_and_conf_wins(tmp_path: Path) -> None:
    files = write_orders(tmp_path / "orders", rows=500)
    script = tmp_path / "job.sql"
    script.write_text(
        "SET 'pipeline.name' = 'from-sql';\nSET 'parallelism.default' = '3';\nSET 'spark.master' = 'local[2]';\n"
        "SET 'pipeline.progress' = 'off';\n"
        + ORDERS_DDL.format(path=files, scan="")
        + f"CREATE TABLE out (c BIGINT) WITH ('connector' = 'filesystem', 'path' = '{tmp_path / 'out'}', "
        "'format' = 'parquet'); INSERT INTO out SELECT order_id FROM orders;"
    )
    result = runner.invoke(app, ["sql", str(script), "--json", "--conf", "parallelism.default=1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["plan"]["name"] == "from-sql"
    assert report["plan"]["default_parallelism"] == 1  # --conf wins over SET
    assert report["sinks"][0]["rows"] == 500


def test_explain_prints_the_plan_and_runs_nothing(tmp_path: Path) -> None:
    script = tmp_path / "explain.sql"
    script.write_text(
        ORDERS_DDL.format(path=tmp_path / "nowhere", scan=", 'scan.parallelism' = '3'")
        + f"CREATE TABLE out (user_id STRING, n BIGINT) WITH ('connector' = 'filesystem', 'path' = "
        f"'{tmp_path / 'out'}', 'format' = 'parquet');\n"
        "EXPLAIN INSERT INTO out SELECT user_id, COUNT(*) FROM orders GROUP BY user_id;"
    )
    result = runner.invoke(app, ["sql", str(script), "-p", "2"])
    assert result.exit_code == 0, result.output
    assert "[0] parallelism 3: orders" in result.output
    assert "[1] parallelism 2: aggregate (out)" in result.output
    assert "<- [0] hash by user_id" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.jvm
def test_print_sink_shows_rows_like_flink(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pd.DataFrame({"k": [1, 2], "v": ["a", None]}).to_parquet(tmp_path / "in" / "x.parquet")
    script = tmp_path / "print.sql"
    script.write_text(
        f"SET 'spark.master' = 'local[2]'; SET 'pipeline.progress' = 'off';"
        f"CREATE TABLE t (k BIGINT, v STRING) WITH ('connector' = 'filesystem', 'path' = '{tmp_path / 'in'}', "
        "'format' = 'parquet'); CREATE TABLE p (k BIGINT, v STRING) WITH ('connector' = 'print', "
        "'print-identifier' = 'rows', 'sink.parallelism' = '1'); INSERT INTO p SELECT k, v FROM t;"
    )
    result = runner.invoke(app, ["sql", str(script), "-p", "1"])
    assert result.exit_code == 0, result.output
    assert "rows> +I[1, a]" in result.output
    assert "rows> +I[2, null]" in result.output  # Flink's Row.toString


@pytest.mark.jvm
def test_python_and_sql_mix_in_one_pipeline(tmp_path: Path) -> None:
    files = write_orders(tmp_path / "orders", rows=1_500)
    p = pipeline()
    p.sql(ORDERS_DDL.format(path=files, scan=""))
    big = p.sql("SELECT user_id, amount FROM orders WHERE amount > 100")
    assert big is not None
    per_user = big.key_by("user_id").aggregate(total="sum(amount)")
    p.create_temporary_view("per_user", per_user)
    p.sql(
        f"CREATE TABLE out (user_id STRING, total DOUBLE) WITH ('connector' = 'filesystem', "
        f"'path' = '{tmp_path / 'out'}', 'format' = 'parquet');"
        "INSERT INTO out SELECT user_id, total FROM per_user WHERE total > 1000;"
    )
    p.run()
    got = sorted_frame(pd.read_parquet(tmp_path / "out"), "user_id")
    expected = duckdb.sql(
        f"SELECT user_id, SUM(amount) AS total FROM '{files}/*.parquet' WHERE amount > 100 GROUP BY user_id "
        "HAVING SUM(amount) > 1000"
    ).df()
    pd.testing.assert_frame_equal(got, sorted_frame(expected, "user_id"), check_dtype=False, rtol=1e-9)


@pytest.mark.jvm
def test_group_by_over_a_watched_directory_emits_a_changelog(tmp_path: Path) -> None:
    """An unbounded source: each micro-batch (one file) updates the groups it touches with
    -U/+U; the current table of the output equals DuckDB's answer over all files."""
    files = write_orders(tmp_path / "orders", rows=3_000)
    p = pipeline(**{"execution.checkpointing.interval": "0 s"})
    p.sql(
        "CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, qty INT, country STRING) WITH ("
        f"'connector' = 'filesystem', 'path' = '{files}', 'format' = 'parquet', 'source.watch' = 'true', "
        "'source.max-files-per-batch' = '1');"
        f"CREATE TABLE out (country STRING, n BIGINT, top DOUBLE, users BIGINT) WITH ('connector' = 'filesystem', "
        f"'path' = '{tmp_path / 'out'}', 'format' = 'parquet');"
        "INSERT INTO out SELECT country, COUNT(*), MAX(amount), COUNT(DISTINCT user_id) FROM orders GROUP BY country;"
    )
    result = p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 3
    written = read_output(tmp_path / "out")
    assert set(written["op"]) == {"+I", "-U", "+U"}
    got = current(pa.Table.from_pandas(written, preserve_index=False)).to_pandas()
    expected = duckdb.sql(
        f"SELECT country, COUNT(*) AS n, MAX(amount) AS top, COUNT(DISTINCT user_id) AS users "
        f"FROM '{files}/*.parquet' GROUP BY country"
    ).df()
    pd.testing.assert_frame_equal(sorted_frame(got, "country"), sorted_frame(expected, "country"), check_dtype=False)


def test_log_append_of_a_changelog_file(tmp_path: Path) -> None:
    good = tmp_path / "changes.jsonl"
    good.write_text(
        '{"id": 1, "v": "a", "op": "+I"}\n{"id": 1, "v": "a", "op": "-U"}\n{"id": 1, "v": "b", "op": "+U"}\n'
    )
    appended = runner.invoke(app, ["log", "append", str(tmp_path / "log"), "--file", str(good), "--key", "id"])
    assert appended.exit_code == 0, appended.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 2, "v": "c", "op": "+I"}\n{"id": 2, "v": "c", "op": "delete"}\n')
    refused = runner.invoke(app, ["log", "append", str(tmp_path / "log"), "--file", str(bad), "--key", "id"])
    assert refused.exit_code == 2
    assert refused.output.strip().startswith("error: append to changelog")
    assert "row 1 has op='delete'; a row kind is one of +I, -U, +U, -D" in refused.output
    assert sum(Log(tmp_path / "log").end_offsets()) == 3  # the bad file appended nothing


@pytest.mark.jvm
def test_group_by_without_aggregates_is_distinct(tmp_path: Path) -> None:
    files = write_orders(tmp_path / "orders", rows=2_000)
    p = pipeline()
    p.sql(
        ORDERS_DDL.format(path=files, scan=", 'scan.parallelism' = '3'")
        + "CREATE TABLE out (country STRING, qty INT) WITH ('connector' = 'filesystem', "
        f"'path' = '{tmp_path / 'out'}', 'format' = 'parquet');"
        "INSERT INTO out SELECT country, qty FROM orders WHERE qty < 4 GROUP BY country, qty;"
    )
    p.run()
    got = pd.read_parquet(tmp_path / "out").sort_values(["country", "qty"]).reset_index(drop=True)
    expected = duckdb.sql(f"SELECT DISTINCT country, qty FROM '{files}/*.parquet' WHERE qty < 4").df()
    expected = expected.sort_values(["country", "qty"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


WITH_QUERIES = {  # sink -> a query with WITH (as Flink reads it), run by keyflow and DuckDB alike
    "spenders": "WITH big AS (SELECT user_id, amount FROM orders WHERE amount > 100), per_user AS (SELECT user_id, "
    "COUNT(*) AS n, SUM(amount) AS total FROM big GROUP BY user_id) SELECT user_id, n, total FROM per_user WHERE n > 1",
    "pairs": "WITH big AS (SELECT order_id, user_id, amount FROM orders WHERE country = 'FR') SELECT a.order_id, "
    "b.order_id AS other, a.user_id FROM big a JOIN big b ON a.user_id = b.user_id AND a.order_id < b.order_id",
}
WITH_SINKS = {
    "spenders": "user_id STRING, n BIGINT, total DOUBLE",
    "pairs": "order_id BIGINT, other BIGINT, user_id STRING",
}


@pytest.mark.jvm
def test_with_queries_equal_duckdb(tmp_path: Path) -> None:
    """WITH queries are views of their statement: read by later ones, read twice (a self-join),
    the same name in two statements, and ``WITH … INSERT INTO`` as Flink writes it."""
    files = write_orders(tmp_path / "orders", rows=3_000)
    script = ORDERS_DDL.format(path=files, scan="")
    for sink, columns in WITH_SINKS.items():
        script += (f"CREATE TABLE {sink} ({columns}) WITH ('connector' = 'filesystem', 'path' = "
                   f"'{tmp_path / sink}', 'format' = 'parquet');\n")  # fmt: skip
    script += f"INSERT INTO spenders {WITH_QUERIES['spenders']};\n"
    script += WITH_QUERIES["pairs"].replace(" SELECT a.order_id", " INSERT INTO pairs SELECT a.order_id", 1) + ";"
    p = pipeline()
    p.sql(script)
    p.run()
    for sink, query in WITH_QUERIES.items():
        got = read_output(tmp_path / sink)
        expected = duckdb.sql(query.replace("WITH ", f"WITH orders AS (FROM '{files}/*.parquet'), ", 1)).df()
        columns = list(expected.columns)
        assert len(expected) > 20
        pd.testing.assert_frame_equal(got[columns].sort_values(columns, ignore_index=True),
                                      expected.sort_values(columns, ignore_index=True), check_dtype=False)  # fmt: skip


def test_division_in_a_join_condition_and_a_computed_column_is_flinks() -> None:
    p = pipeline()
    p.sql("CREATE TABLE t (a INT, c DOUBLE, h AS a / 2) WITH ('connector' = 'filesystem', 'path' = '/tmp/none', "
          "'format' = 'parquet'); CREATE TABLE u (id INT) WITH ('connector' = 'filesystem', 'path' = '/tmp/none2', "
          "'format' = 'parquet'); CREATE TABLE o (x DOUBLE) WITH ('connector' = 'blackhole');"
          "INSERT INTO o SELECT t.c FROM t JOIN u ON t.a / 2 = u.id;")  # fmt: skip
    keys = [node.describe()["columns"] for node in p.operators.values() if node.kind == "with_columns"]
    assert {"__join1_left0": "CAST((a) DIV (2) AS INT)"} in keys


def test_with_queries_of_one_name_in_two_statements_keep_their_operators_apart() -> None:
    """Operators of a WITH query are named after its statement's sink, so a streaming restore
    finds each statement's own state; a view's body does not see the statement's WITH queries."""
    p = pipeline()
    p.sql(ORDERS_DDL.format(path="/tmp/none", scan="") + "CREATE TABLE o1 (u STRING, n BIGINT) WITH ('connector' = "
          "'blackhole'); CREATE TABLE o2 (u STRING, n BIGINT) WITH ('connector' = 'blackhole');"
          "INSERT INTO o1 WITH per AS (SELECT user_id, COUNT(*) AS n FROM orders GROUP BY user_id) SELECT * FROM per;"
          "INSERT INTO o2 WITH per AS (SELECT user_id, COUNT(*) AS n FROM orders WHERE qty > 1 GROUP BY user_id) "
          "SELECT * FROM per;")  # fmt: skip
    names = sorted(node.name for node in p.operators.values() if node.kind == "aggregate")
    assert names == ["aggregate (o1/per)", "aggregate (o2/per)"]


def test_with_mistakes_are_named() -> None:
    sink = "CREATE TABLE o (n INT) WITH ('connector' = 'blackhole'); INSERT INTO o SELECT * FROM v;"
    for query, message in (
        ("WITH RECURSIVE r AS (SELECT 1 AS n) SELECT n FROM r", r"WITH RECURSIVE at line \d+, column \d+ is not"),
        ("WITH orders AS (SELECT 1 AS n) SELECT n FROM orders",
         r"WITH orders at line \d+, column \d+: a table, view or WITH query is named 'orders' already"),
        ("WITH c (n) AS (SELECT qty FROM orders) SELECT n FROM c", r"WITH c \(…\) at line \d+, column \d+: a column "
         r"list is not supported; name the columns in its SELECT"),
        ("WITH d AS (SELECT qty AS n FROM e), e AS (SELECT qty FROM orders) SELECT n FROM d",
         r"WITH d at line \d+, column \d+ reads 'e', a WITH query declared after it"),
    ):  # fmt: skip
        script = ORDERS_DDL.format(path="/tmp/none", scan="") + f"CREATE VIEW v AS {query}; {sink}"
        with pytest.raises(SqlError, match=message):
            pipeline().sql(script)
    hidden = ("CREATE VIEW v AS SELECT n FROM c; CREATE TABLE o (n INT) WITH ('connector' = 'blackhole');"
              "INSERT INTO o WITH c AS (SELECT qty AS n FROM orders) SELECT * FROM v;")  # fmt: skip
    with pytest.raises(SqlError, match=r"no table or view 'c' to read FROM"):  # a view's body sees no WITH query
        pipeline().sql(ORDERS_DDL.format(path="/tmp/none", scan="") + hidden)


@pytest.mark.jvm
def test_a_python_function_registered_in_the_api_runs_in_sql_and_python_expressions(tmp_path: Path) -> None:
    """``Pipeline.register_function`` (Flink's createTemporarySystemFunction): one vectorised
    function called from SQL and from a Python select; the answer equals pandas'."""
    from tests.udfs import count_char

    words = pd.DataFrame({"word": ["cocoa", "abc", "", "ccc", None]})
    (tmp_path / "in").mkdir()
    words.to_parquet(tmp_path / "in" / "part-0.parquet")
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    pipeline.register_function("count_char", count_char)
    pipeline.register_function("shout", lambda text: text.str.upper(), "STRING")
    pipeline.sql(f"""
        CREATE TABLE words (word STRING)
          WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "in"}', 'format' = 'parquet');
        CREATE TABLE counted (word STRING, c BIGINT, loud STRING)
          WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "out"}', 'format' = 'parquet');
        INSERT INTO counted SELECT word, count_char(word, 'c'), shout(word) FROM words;
    """)
    pipeline.run()
    got = pd.read_parquet(tmp_path / "out").sort_values("word", na_position="last").reset_index(drop=True)
    expected = words.assign(c=words["word"].str.count("c"), loud=words["word"].str.upper())
    expected = expected.sort_values("word", na_position="last").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_functions_are_checked_when_registered() -> None:
    from keyflow.errors import PlanError

    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    with pytest.raises(PlanError, match=r"function name 'no such' must be an identifier"):
        pipeline.register_function("no such", len, "BIGINT")
    with pytest.raises(PlanError, match=r"function 'f' is 3, not a callable"):
        pipeline.register_function("f", 3, "BIGINT")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"function 'f' has no result type"):
        pipeline.register_function("f", len)
    pipeline.register_function("f", len, "BIGINT")
    with pytest.raises(PlanError, match=r"a function named 'f' is registered already"):
        pipeline.register_function("f", len, "BIGINT")


@pytest.mark.jvm
def test_integer_division_has_flinks_meaning(tmp_path: Path) -> None:
    """Flink divides integers as integers (truncated toward zero, typed as the wider side);
    a floating-point side keeps the division a DOUBLE; an AVG of integers is an integer too.
    Followed through a view, a derived table and an aggregate; the answers from pandas."""
    rng = np.random.default_rng(4)
    frame = pd.DataFrame({"a": rng.integers(-500, 500, 400).astype(np.int32),
                          "b": rng.choice([-7, -3, -2, 2, 3, 5, 11], 400).astype(np.int64),
                          "c": rng.uniform(-9, 9, 400)})  # fmt: skip
    (tmp_path / "nums").mkdir()
    frame.to_parquet(tmp_path / "nums" / "part-0.parquet", index=False)
    p = pipeline()
    p.sql(
        f"CREATE TABLE nums (a INT, b BIGINT, c DOUBLE) WITH ('connector' = 'filesystem', 'path' = "
        f"'{tmp_path / 'nums'}', 'format' = 'parquet');"
        f"CREATE TABLE out (a INT, b BIGINT, q BIGINT, half INT, quarter BIGINT, mixed DOUBLE, real DOUBLE) WITH "
        f"('connector' = 'filesystem', 'path' = '{tmp_path / 'out'}', 'format' = 'parquet');"
        "CREATE VIEW halves AS SELECT a, b, c, a / 2 AS half FROM nums;"
        "INSERT INTO out SELECT a, b, a / b, half, again / 2, c / b, a / 2.0 FROM "
        "(SELECT a, b, c, half, half AS again FROM halves) t;"
        f"CREATE TABLE means (b BIGINT, mean INT, real DOUBLE, halved INT) WITH ('connector' = 'filesystem', 'path' "
        f"= '{tmp_path / 'means'}', 'format' = 'parquet');"
        "INSERT INTO means SELECT b, AVG(a), AVG(c), AVG(a) / 2 FROM nums GROUP BY b;"
    )
    p.run()
    got = read_output(tmp_path / "out")
    got = got.sort_values(list(got.columns), ignore_index=True)
    truncated = np.trunc(frame["a"] / frame["b"]).astype(np.int64)
    expected = frame.assign(q=truncated, half=np.trunc(frame["a"] / 2).astype(np.int32),
                            quarter=np.trunc(np.trunc(frame["a"] / 2) / 2).astype(np.int64),
                            mixed=frame["c"] / frame["b"], real=frame["a"] / 2.0)  # fmt: skip
    expected = expected[list(got.columns)].sort_values(list(got.columns), ignore_index=True)
    assert (frame["a"] % frame["b"] != 0).sum() > 250  # most divisions have a remainder to drop
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    grouped = frame.groupby("b")
    mean = np.trunc(grouped["a"].mean()).astype(np.int64)
    means = pd.DataFrame({"b": mean.index, "mean": mean.to_numpy(), "real": grouped["c"].mean().to_numpy(),
                          "halved": np.trunc(mean / 2).astype(np.int64).to_numpy()})  # fmt: skip
    got_means = read_output(tmp_path / "means").sort_values("b", ignore_index=True)
    pd.testing.assert_frame_equal(got_means[list(means.columns)], means, check_dtype=False)


@pytest.mark.parametrize(
    ("expression", "planned"),
    [
        ("a / b", "CAST((a) DIV (b) AS BIGINT)"),  # the wider side's type
        ("a / 2", "CAST((a) DIV (2) AS INT)"),
        ("d / a", "CAST((d) DIV (a) AS INT)"),
        ("a / 3000000000", "CAST((a) DIV (3000000000) AS BIGINT)"),  # a BIGINT literal
        ("(a + d) * 2 / CAST(c AS INT)", "CAST(((a + d) * 2) DIV (CAST(c AS INT)) AS INT)"),
        ("c / a", "c / a"),  # a DOUBLE side: Spark's and Flink's DOUBLE division
        ("a / 2.0", "a / 2.0"),  # a DECIMAL literal: left to Spark
        ("CASE WHEN a > 0 THEN a ELSE 1 END / 2", "CASE WHEN a > 0 THEN a ELSE 1 END / 2"),  # type not followed
        ("a / 2 / 3", "CAST((CAST((a) DIV (2) AS INT)) DIV (3) AS INT)"),  # innermost first
        ("h / 1", "CAST((h) DIV (1) AS INT)"),  # a computed column h AS a / 2 is an INT (computed so)
    ],
)
def test_division_of_known_integers_is_planned_as_flinks(expression: str, planned: str) -> None:
    p = pipeline()
    p.sql("CREATE TABLE t (a INT, b BIGINT, c DOUBLE, d SMALLINT, h AS a / 2) WITH ('connector' = 'filesystem', "
          "'path' = '/tmp/none', 'format' = 'parquet'); CREATE TABLE o (x DOUBLE) WITH ('connector' = 'blackhole');"
          f"INSERT INTO o SELECT {expression} FROM t;")  # fmt: skip
    selects = [e for node in p.operators.values() if node.kind == "select" for e in node.describe()["expressions"]]
    assert f"{planned} AS `EXPR$0`" in selects, selects
