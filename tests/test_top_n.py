"""Flink's Top-N and deduplication: the worker function against Flink's own harness tests
(``TopNFunctionTestBase``, ``RowTimeDeduplicateFunctionTest``: same records, same expected
changelog), then SQL streaming over micro-batches against DuckDB."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyflow import Log, Pipeline, parquet
from keyflow.changelog import current
from keyflow.connectors.streams import log
from keyflow.errors import RestoreError
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan.descriptors import StateDescriptor
from keyflow.plan.graph import JobGraph
from keyflow.plan.nodes import RankNode
from keyflow.plan.restore import WORDS, check_restorable
from keyflow.plan.state_schema import StateLayout
from keyflow.runtime.ranks import RankShape, TopNRows
from keyflow.runtime.workers import KeyedRunner, KeyedTask
from keyflow.state.durable import MemoryState
from keyflow.state.memory import KeyedStateStore
from tests.pipelines import TEST_SPARK
from tests.streams import read_output, split, write_parts

START = pd.Timestamp("2026-01-01 00:00:00")
ROW = pa.struct([("category", pa.string()), ("id", pa.int64()), ("price", pa.int32())])
BOOKS_AND_FRUIT = [("book", 1, 12), ("book", 2, 19), ("book", 4, 11), ("book", 5, 11),
                   ("fruit", 4, 33), ("fruit", 3, 44), ("fruit", 5, 22)]  # fmt: skip


class HeldState(MemoryState):
    """Each subtask's state kept from one run to the next, as a checkpoint restores it."""

    def __init__(self) -> None:
        self.store: KeyedStateStore | None = None

    def open(self, descriptors: dict[str, StateDescriptor], subtask: int, first: int, last: int) -> KeyedStateStore:
        if self.store is None:
            self.store = KeyedStateStore(descriptors)
        self.store.take_touched()
        return self.store


def drive(shape: RankShape, records: list[tuple[Any, ...]], state: HeldState | None = None) -> list[Counter[Any]]:
    """Each record in a call of its own (as Flink's harness processes elements), through the real
    KeyedRunner: what each call emitted, as (row kind, *row) counts."""
    numbered = [pa.field(shape.rank_column, pa.int64())] if shape.rank_column else []
    schema = pa.schema([*shape.row_type, *numbered, pa.field("op", pa.string())])
    task = KeyedTask("rank 'r'", schema, ("category",), shape.state(), 1, 1, state or HeldState())
    runner = KeyedRunner(TopNRows(shape, schema), task)
    emitted = []
    for record in records:
        row = dict(zip(shape.row_type.names, record, strict=True))
        table = pa.Table.from_pylist([row], pa.schema(list(shape.row_type)))
        table = table.append_column(KEY_GROUP_COLUMN, pa.array([0], pa.int32()))
        out = pa.Table.from_batches(list(runner(iter(table.to_batches()))), schema=schema).to_pylist()
        emitted.append(Counter((row.pop("op"), *row.values()) for row in out))
    return emitted


def by_record(*calls: list[tuple[Any, ...]]) -> list[Counter[Any]]:
    return [Counter(call) for call in calls]


def test_output_rank_number_with_constant_rank_range() -> None:
    """TopNFunctionTestBase#testOutputRankNumberWithConstantRankRange (rank 1..2, row numbers):
    a row entering above others moves each of them down one rank (-U old, +U new); on a tie the
    earlier row stays ahead."""
    got = drive(RankShape(ROW, (("price", False),), 2, "rank"), BOOKS_AND_FRUIT)
    assert got == by_record(
        [("+I", "book", 1, 12, 1)],
        [("+I", "book", 2, 19, 2)],
        [("-U", "book", 1, 12, 1), ("+U", "book", 4, 11, 1), ("-U", "book", 2, 19, 2), ("+U", "book", 1, 12, 2)],
        [("-U", "book", 1, 12, 2), ("+U", "book", 5, 11, 2)],
        [("+I", "fruit", 4, 33, 1)],
        [("+I", "fruit", 3, 44, 2)],
        [("-U", "fruit", 4, 33, 1), ("+U", "fruit", 5, 22, 1), ("-U", "fruit", 3, 44, 2), ("+U", "fruit", 4, 33, 2)],
    )


def test_constant_rank_range_without_offset() -> None:
    """TopNFunctionTestBase#testConstantRankRangeWithoutOffset: without row numbers a row pushed
    out is deleted and the new one inserted; the state carries over a restore (the same state,
    a new runner) and the next row pushes out the then last one."""
    shape, state = RankShape(ROW, (("price", False),), 2, None), HeldState()
    records = [r for r in BOOKS_AND_FRUIT if r[1:] != (5, 11)]
    got = drive(shape, records, state)
    assert got == by_record(
        [("+I", "book", 1, 12)],
        [("+I", "book", 2, 19)],
        [("-D", "book", 2, 19), ("+I", "book", 4, 11)],
        [("+I", "fruit", 4, 33)],
        [("+I", "fruit", 3, 44)],
        [("-D", "fruit", 3, 44), ("+I", "fruit", 5, 22)],
    )
    assert drive(shape, [("book", 5, 10)], state) == by_record([("-D", "book", 1, 12), ("+I", "book", 5, 10)])


def test_constant_rank_range_with_offset() -> None:
    """TopNFunctionTestBase#testConstantRankRangeWithOffset (rank 2..2, no row numbers): only the
    second row is emitted; when it changes, the old one is updated to the new (-U/+U)."""
    got = drive(RankShape(ROW, (("price", False),), 2, None, first=2), [r for r in BOOKS_AND_FRUIT if r[1:] != (5, 11)])
    assert got == by_record(
        [],
        [("+I", "book", 2, 19)],
        [("-U", "book", 2, 19), ("+U", "book", 1, 12)],
        [],
        [("+I", "fruit", 3, 44)],
        [("-U", "fruit", 3, 44), ("+U", "fruit", 4, 33)],
    )


def test_a_call_of_many_rows_emits_the_net_change_of_its_keys() -> None:
    """Rows of one micro-batch arrive in one call: the change of each key's top, not every step
    of it, so the changelog's current table equals the one row at a time."""
    shape = RankShape(ROW, (("price", False),), 2, "rank")
    table = pa.Table.from_pylist([dict(zip(ROW.names, r, strict=True)) for r in BOOKS_AND_FRUIT])
    table = table.append_column(KEY_GROUP_COLUMN, pa.array(np.zeros(len(BOOKS_AND_FRUIT), np.int32)))
    schema = pa.schema([*ROW, pa.field("rank", pa.int64()), pa.field("op", pa.string())])
    runner = KeyedRunner(TopNRows(shape, schema), KeyedTask("rank 'r'", schema, ("category",), shape.state(), 1, 1,
                                                            MemoryState()))  # fmt: skip
    out = pa.Table.from_batches(list(runner(iter(table.to_batches()))), schema=schema).to_pylist()
    assert Counter((row.pop("op"), *row.values()) for row in out) == Counter(
        [("+I", "book", 4, 11, 1), ("+I", "book", 5, 11, 2), ("+I", "fruit", 5, 22, 1), ("+I", "fruit", 4, 33, 2)]
    )


DEDUPLICATED = [("key1", 13, 99), ("key1", 13, 99), ("key1", 12, 100), ("key2", 11, 101)]
RESTORED = [("key1", 12, 300), ("key2", 11, 301), ("key3", 5, 299), ("key1", 12, 400), ("key2", 11, 401)]


@pytest.mark.parametrize("keep_last", [False, True], ids=["keep_first_row", "keep_last_row"])
def test_row_time_deduplicate(keep_last: bool) -> None:
    """RowTimeDeduplicateFunctionTest#testRowTimeDeduplicateKeepFirstRow/KeepLastRow (Flink's
    expected output without state TTL): keeping the first row ignores later ones; keeping the
    last, a row of an equal or later time replaces the kept one (-U/+U). Across a restore."""
    row = pa.struct([("category", pa.string()), ("id", pa.int64()), ("rowtime", pa.int64())])
    shape, state = RankShape(row, (("rowtime", keep_last),), 1, None, keep_last, True), HeldState()
    first = DEDUPLICATED[1:] if keep_last else DEDUPLICATED  # Flink's keep-last test has no duplicate
    got = [*drive(shape, first, state), *drive(shape, RESTORED, state)]
    changes = Counter[Any]()
    for call in got:
        changes.update(call)
    if not keep_last:
        assert changes == Counter([("+I", "key1", 13, 99), ("+I", "key2", 11, 101), ("+I", "key3", 5, 299)])
        return
    assert changes == Counter(
        [
            ("+I", "key1", 13, 99), ("-U", "key1", 13, 99), ("+U", "key1", 12, 100), ("+I", "key2", 11, 101),
            ("-U", "key1", 12, 100), ("+U", "key1", 12, 300), ("-U", "key2", 11, 101), ("+U", "key2", 11, 301),
            ("+I", "key3", 5, 299), ("-U", "key1", 12, 300), ("+U", "key1", 12, 400), ("-U", "key2", 11, 301),
            ("+U", "key2", 11, 401),
        ]
    )  # fmt: skip
    equal_time = drive(shape, [("key4", 1, 7), ("key4", 2, 7)])
    assert equal_time[1] == Counter([("-U", "key4", 1, 7), ("+U", "key4", 2, 7)])  # Flink's: an equal time replaces


def write_orders(directory: Path, files: int = 3, rows: int = 1_500) -> pd.DataFrame:
    """Orders of skewed users over ``files`` Parquet files (one micro-batch each), some amounts
    null, some equal, each with an event time."""
    rng = np.random.default_rng(5)
    frame = pd.DataFrame(
        {
            "order_id": np.arange(rows, dtype=np.int64),
            "user_id": [f"u{n}" for n in np.minimum(rng.zipf(1.4, rows), 60)],
            "amount": rng.integers(1, 40, rows).astype(np.float64),
            "ts": (pd.Timestamp("2026-01-01") + pd.to_timedelta(rng.permutation(rows), unit="s")).astype("M8[us]"),
        }
    )
    frame.loc[frame.index % 11 == 0, "amount"] = np.nan
    write_parts(directory, split(frame, files))
    return frame


@pytest.mark.jvm
def test_top_n_and_deduplication_stream_over_micro_batches_equal_duckdb(tmp_path: Path) -> None:
    """Three micro-batches (files) through a Top-3 with row numbers (nulls last, ties broken by a
    second column) and a deduplication keeping each user's first order by event time: each
    output's current table equals DuckDB's ROW_NUMBER over all the rows."""
    orders = tmp_path / "orders"
    write_orders(orders)
    pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, "execution.checkpointing.interval": "0 s"})
    pipeline.sql(
        f"""
        CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, ts TIMESTAMP(3),
          WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
        WITH ('connector' = 'filesystem', 'path' = '{orders}', 'format' = 'parquet', 'source.watch' = 'true',
              'source.max-files-per-batch' = '1');
        CREATE TABLE top3 (user_id STRING, order_id BIGINT, amount DOUBLE, rn BIGINT)
        WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "top3"}', 'format' = 'parquet');
        CREATE TABLE seconds (user_id STRING, order_id BIGINT, amount DOUBLE)
        WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "seconds"}', 'format' = 'parquet');
        INSERT INTO seconds SELECT user_id, order_id, amount FROM (
          SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY amount DESC, order_id) AS rn FROM orders)
        WHERE rn BETWEEN 2 AND 3;
        CREATE TABLE firsts (user_id STRING, order_id BIGINT, ts TIMESTAMP(3))
        WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "firsts"}', 'format' = 'parquet');
        INSERT INTO top3 SELECT user_id, order_id, amount, rn FROM (
          SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY amount DESC, order_id) AS rn FROM orders)
        WHERE rn <= 3;
        INSERT INTO firsts SELECT user_id, order_id, ts FROM (
          SELECT user_id, order_id, ts, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY ts) AS first_order
          FROM orders) WHERE first_order = 1;
        """
    )
    assert "deduplicate=keep first row" in pipeline.plan().render()
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 3
    written = read_output(tmp_path / "top3")
    assert {"+I", "-U", "+U"} <= set(written["op"])  # rows moved down a rank between micro-batches
    got = current(pa.Table.from_pandas(written, preserve_index=False)).to_pandas()
    expected = duckdb.sql(
        f"SELECT user_id, order_id, amount, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY "
        f"amount DESC NULLS LAST, order_id) AS rn FROM '{orders}/*.parquet') WHERE rn <= 3"
    ).df()
    assert_same_rows(got, expected, ["user_id", "rn"])
    seconds = current(pa.Table.from_pandas(read_output(tmp_path / "seconds"), preserve_index=False)).to_pandas()
    assert_same_rows(seconds, expected[expected["rn"] >= 2][["user_id", "order_id", "amount"]], ["order_id"])
    firsts = current(pa.Table.from_pandas(read_output(tmp_path / "firsts"), preserve_index=False)).to_pandas()
    expected_firsts = duckdb.sql(
        f"SELECT user_id, order_id, ts FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY ts) AS rn "
        f"FROM '{orders}/*.parquet') WHERE rn = 1"
    ).df()
    assert_same_rows(firsts, expected_firsts, ["user_id"])


def assert_replays(directory: Path) -> None:
    """The changelog's micro-batches replayed in order retract only rows they hold: after
    every micro-batch no row has been retracted more often than added."""
    files = sorted(path for path in directory.glob("part-*") if path.is_file())
    batches = sorted({path.name.split("-")[1] for path in files})
    held: Counter[tuple[Any, ...]] = Counter()
    for batch in batches:
        rows = pd.concat([pd.read_parquet(path) for path in files if path.name.split("-")[1] == batch])
        for row in rows.astype(object).itertuples(index=False):
            values = tuple(None if v != v else v for v in row[:-1])  # NaN as None; op last
            held[values] += -1 if row[-1] in ("-D", "-U") else 1
        assert min(held.values(), default=0) >= 0, f"{directory.name}: batch {batch} retracts a row it does not hold"


def watched_orders(tmp_path: Path) -> tuple[Path, Pipeline]:
    """``write_orders``' three files, and a pipeline reading them as a stream, a file per
    micro-batch, as the table ``orders``."""
    orders = tmp_path / "orders"
    write_orders(orders)
    pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, "execution.checkpointing.interval": "0 s"})
    pipeline.sql(
        "CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, ts TIMESTAMP(3)) WITH ('connector' = "
        f"'filesystem', 'path' = '{orders}', 'format' = 'parquet', 'source.watch' = 'true', "
        "'source.max-files-per-batch' = '1');"
    )
    return orders, pipeline


def assert_same_rows(got: pd.DataFrame, expected: pd.DataFrame, by: list[str]) -> None:
    assert len(expected) > 20
    got = got.sort_values(by, ignore_index=True)
    expected = expected.sort_values(by, ignore_index=True)
    pd.testing.assert_frame_equal(got, expected[list(got.columns)], check_dtype=False)


def test_a_top_n_restores_only_with_its_order_and_number_of_rows() -> None:
    """The plan records what a Top-N keeps: another N or order would read rows it never kept."""

    def graph(limit: int, order: str = "amount DESC") -> JobGraph:
        pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
        pipeline.sql(
            "CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE) WITH ('connector' = 'filesystem', "
            "'path' = '/tmp/orders', 'format' = 'parquet', 'source.watch' = 'true');"
            "CREATE TABLE out (user_id STRING, amount DOUBLE) WITH ('connector' = 'blackhole');"
            f"INSERT INTO out SELECT user_id, amount FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY "
            f"{order}) AS rn FROM orders) WHERE rn <= {limit};"
        )
        return pipeline.compile().graph

    saved = graph(3)
    assert check_restorable(saved, graph(3), None, False, "ckpt") == []
    with pytest.raises(
        RestoreError,
        match=r"operator 'top-n \(out\)' \(uid 'top-n \(out\)\[user_id\]'\) cannot restore its state from checkpoint "
        r"ckpt: it now keeps \{'rows': 'the first 5 rows by amount DESC'\}, the checkpoint \{'rows': 'the first 3 "
        r"rows by amount DESC'\}",
    ):
        check_restorable(saved, graph(5), None, False, "ckpt")
    with pytest.raises(RestoreError, match=r"it now keeps \{'rows': 'the first 3 rows by amount ASC'\}"):
        check_restorable(saved, graph(3, "amount"), None, False, "ckpt")
    # a restore error names any two layouts in words (a Top-N of a changelog keeps every row: all_rows)
    assert {layout.value for layout in StateLayout} <= set(WORDS)


ORDERS_TABLE = (
    "CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, s ROW<user_id STRING>, ts TIMESTAMP(3), "
    "WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'filesystem', 'path' = '{path}', "
    "'format' = 'parquet'{watch});\n"
)


def ranks_of(query: str, columns: str = "user_id STRING, amount DOUBLE", watch: bool = True) -> list[RankNode]:
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    table = ORDERS_TABLE.format(path="/tmp/orders", watch=", 'source.watch' = 'true'" if watch else "")
    pipeline.sql(table + f"CREATE TABLE out ({columns}) WITH ('connector' = 'blackhole');\nINSERT INTO out {query};")
    return [node for node in pipeline.operators.values() if isinstance(node, RankNode)]


RANKED = "(SELECT *, ROW_NUMBER() OVER (PARTITION BY {key} ORDER BY {order}) AS rn FROM orders)"


@pytest.mark.parametrize(
    ("where", "limit"),
    [("(rn <= 3)", 3), ("(rn <= 3 AND amount > 1)", 3), ("rn >= 1 AND rn < 3", 2), ("rn BETWEEN 1 AND 4", 4),
     ("2 >= rn", 2)],
)  # fmt: skip
def test_the_rank_filter_in_every_form_flink_reads(where: str, limit: int) -> None:
    (rank,) = ranks_of(f"SELECT user_id, amount FROM {RANKED.format(key='user_id', order='amount')} WHERE {where}")
    assert rank.limit == limit
    assert rank.rank_column is None


def test_the_row_number_is_kept_where_any_part_of_the_query_reads_it() -> None:
    query = f"SELECT rn, COUNT(*) FROM {RANKED.format(key='user_id', order='amount')} WHERE rn <= 3 GROUP BY rn"
    (rank,) = ranks_of(query, "rn BIGINT, n BIGINT", watch=False)
    assert rank.rank_column == "rn"


def test_a_top_1_read_with_its_number_ordered_by_event_time_deduplicates() -> None:
    """Flink's RankNumberColumnRemoveRule: a Top-1's number is the constant 1, so the Rank keeps
    no number and, ordered by the event time, is a deduplication (its tie rule: keep the last)."""
    columns = "order_id BIGINT, user_id STRING, amount DOUBLE, s ROW<user_id STRING>, ts TIMESTAMP(3), rn BIGINT"
    (rank,) = ranks_of(f"SELECT * FROM {RANKED.format(key='user_id', order='ts DESC')} WHERE rn = 1", columns)
    assert rank.deduplicates
    assert rank.rank_column is None


def test_a_row_field_partitions_by_the_field_not_a_column_of_its_name() -> None:
    query = (
        "SELECT user_id, amount FROM (SELECT user_id, s.user_id AS user_key, amount, ROW_NUMBER() OVER (PARTITION "
        "BY s.user_id ORDER BY amount) AS rn FROM orders) WHERE rn <= 2"
    )
    (rank,) = ranks_of(query)
    assert rank.keys == ("user_key",)


def test_nan_orders_above_every_number_as_in_spark_and_flink() -> None:
    row = pa.struct([("category", pa.string()), ("id", pa.int64()), ("v", pa.float64())])
    records = [("a", 1, 5.0), ("a", 2, float("nan")), ("a", 3, None), ("a", 4, 7.0)]
    for descending, kept in ((True, [2, 4]), (False, [3, 1])):  # DESC: NaN first; ASC: null, then numbers
        state = HeldState()
        drive(RankShape(row, (("v", descending),), 2, None), records, state)
        assert state.store is not None
        stored = state.store.columns["__top_rows"].get(np.arange(1)).to_pylist()[0]
        assert [r["id"] for r in stored] == kept


@pytest.mark.jvm
def test_a_ranked_table_joined_keeps_its_filter_after_the_join(tmp_path: Path) -> None:
    """The filter on the row number runs after the join (a RIGHT JOIN pads the ranked side with
    nulls, which it drops), and a column of the same name in the other table is its own."""
    write_orders(tmp_path / "orders", files=1)
    users = pd.DataFrame({"user_id": [f"u{n}" for n in range(0, 80, 2)], "rn": np.arange(40) % 5})
    (tmp_path / "users").mkdir()
    users.to_parquet(tmp_path / "users" / "part-0.parquet", index=False)
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    query = (
        "SELECT x.user_id, x.order_id, x.rn, y.rn AS y_rn FROM (SELECT user_id, order_id, ROW_NUMBER() OVER "
        "(PARTITION BY user_id ORDER BY amount DESC, order_id) AS rn FROM orders) x RIGHT JOIN users y ON "
        "x.user_id = y.user_id WHERE x.rn <= 2 AND y.rn <= 3"
    )
    pipeline.sql(
        f"CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, ts TIMESTAMP(3)) WITH ('connector' "
        f"= 'filesystem', 'path' = '{tmp_path / 'orders'}', 'format' = 'parquet');\n"
        f"CREATE TABLE users (user_id STRING, rn BIGINT) WITH ('connector' = 'filesystem', 'path' = "
        f"'{tmp_path / 'users'}', 'format' = 'parquet');\n"
        f"CREATE TABLE out (user_id STRING, order_id BIGINT, rn BIGINT, y_rn BIGINT) WITH ('connector' = "
        f"'filesystem', 'path' = '{tmp_path / 'out'}', 'format' = 'parquet');\nINSERT INTO out {query};"
    )
    pipeline.run()
    expected = duckdb.sql(
        query.replace("FROM orders", f"FROM '{tmp_path}/orders/*.parquet'").replace(
            "JOIN users", f"JOIN '{tmp_path}/users/*.parquet'"
        )
    ).df()
    written = pa.Table.from_pandas(read_output(tmp_path / "out"), preserve_index=False)
    assert_same_rows(current(written).to_pandas(), expected, ["user_id", "rn"])  # a RIGHT JOIN: a changelog


@pytest.mark.jvm
def test_a_full_join_of_a_top_n_and_a_group_by_streams_equal_duckdb(tmp_path: Path) -> None:
    """A join of two updating tables (Flink's join with retractions): each user's top two small
    orders, which move as better orders arrive, FULL JOINed with a streaming GROUP BY whose totals change
    every micro-batch; the output's current table equals DuckDB's answer."""
    orders, pipeline = watched_orders(tmp_path)
    query = (
        "SELECT t.user_id, t.order_id, t.amount, s.user_id AS big_spender, s.total, s.n FROM (SELECT user_id, "
        "order_id, amount FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY amount DESC, order_id) "
        "AS rn FROM orders WHERE amount < 10) WHERE rn <= 2) t FULL JOIN (SELECT user_id, SUM(amount) AS total, "
        "COUNT(*) AS n FROM orders WHERE amount > 20 GROUP BY user_id) s ON t.user_id = s.user_id"
    )
    pipeline.sql(
        f"""
        CREATE TABLE out (user_id STRING, order_id BIGINT, amount DOUBLE, big_spender STRING, total DOUBLE,
          n BIGINT) WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "out"}', 'format' = 'parquet');
        INSERT INTO out {query};
        """
    )
    assert "changelog_join" in pipeline.plan().render()
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 3
    written = read_output(tmp_path / "out")
    assert (written["op"] == "-D").sum() > 50  # the totals and the top two changed between micro-batches
    got = current(pa.Table.from_pandas(written, preserve_index=False)).to_pandas()
    reference = query.replace("FROM orders", f"FROM '{orders}/*.parquet'").replace("DESC,", "DESC NULLS LAST,")
    expected = duckdb.sql(reference).df()
    assert expected["big_spender"].isna().any()  # padded on both sides
    assert expected["user_id"].isna().any()
    got["user_id"] = got["user_id"].fillna(got["big_spender"])
    expected["user_id"] = expected["user_id"].fillna(expected["big_spender"])
    assert_same_rows(got, expected, ["user_id", "order_id"])


@pytest.mark.jvm
def test_a_top_n_of_a_streaming_group_by_refills_from_the_rows_below_and_equals_duckdb(tmp_path: Path) -> None:
    """Flink's RetractableTopN: the top three users by a total that changes every micro-batch
    (a streaming GROUP BY, an updating table); a user whose total drops leaves, and the next
    one takes the place. With and without the row number; each output's current table equals
    DuckDB's ROW_NUMBER over the final totals."""
    orders, pipeline = watched_orders(tmp_path)
    ranked = (
        "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY len ORDER BY total DESC, user_id) AS rn FROM "
        "(SELECT user_id, LENGTH(user_id) AS len, SUM(amount) AS total FROM orders GROUP BY user_id)) WHERE rn <= 3"
    )
    pipeline.sql(
        f"""
        CREATE TABLE numbered (user_id STRING, len INT, total DOUBLE, rn BIGINT)
        WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "numbered"}', 'format' = 'parquet');
        CREATE TABLE leaders (user_id STRING, total DOUBLE)
        WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "leaders"}', 'format' = 'parquet');
        INSERT INTO numbered {ranked};
        INSERT INTO leaders SELECT user_id, total FROM ({ranked});
        """
    )
    assert "retractable_rank" in pipeline.plan().render()
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 3
    expected = duckdb.sql(ranked.replace("FROM orders", f"FROM '{orders}/*.parquet'")).df()
    for sink, columns in (("numbered", ["user_id", "len", "total", "rn"]), ("leaders", ["user_id", "total"])):
        written = read_output(tmp_path / sink)
        assert (written["op"] == "-D").any(), sink  # a leader's total changed, or one left the top
        assert_replays(tmp_path / sink)
        got = current(pa.Table.from_pandas(written, preserve_index=False)).to_pandas()
        want = expected[columns].sort_values(columns[:2], ignore_index=True)
        pd.testing.assert_frame_equal(got.sort_values(columns[:2], ignore_index=True), want, check_dtype=False)
        assert len(want) == 6  # two partitions (user ids of 2 and 3 characters), three each


@pytest.mark.jvm
def test_top_n_of_an_upsert_source_follows_its_updates_and_deletes(tmp_path: Path) -> None:
    """The Python API: ``key_by(...).top_n`` of an upsert log (orders updated and deleted over
    three micro-batches, with a restart between): each user's two largest current orders, as
    pandas ranks the orders' latest versions."""
    schema = pa.schema([("order_id", pa.int64()), ("user", pa.string()), ("amount", pa.int64())])
    Log.create(tmp_path / "orders", 2, schema)
    rng, history = np.random.default_rng(8), []
    for _ in range(3):
        ids = rng.integers(0, 120, 200)
        deleted = rng.random(200) < 0.15
        part = pd.DataFrame(
            {
                "order_id": ids,
                "user": [f"u{n % 7}" for n in ids],
                "amount": pd.Series(rng.integers(1, 1_000, 200)).astype("Int64").where(~deleted, None),
            }
        )
        part["user"] = part["user"].where(~deleted, None)  # fmt: skip
        Log(tmp_path / "orders").append(pa.Table.from_pandas(part, schema=schema, preserve_index=False), key="order_id")
        history.append(part)
        p = Pipeline(parallelism=2, config={**TEST_SPARK, "execution.checkpointing.interval": "0 s"})
        source = p.source(log(str(tmp_path / "orders"), changelog_mode="upsert", primary_key="order_id"), uid="orders")
        ranked = source.key_by("user").top_n(2, "amount DESC", "order_id", row_number="rn").uid("top")
        ranked.sink(parquet(tmp_path / "out"), uid="out")
        p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    latest = pd.concat(history, ignore_index=True).groupby("order_id").tail(1).dropna(subset=["user"])
    latest = latest.sort_values(["user", "amount", "order_id"], ascending=[True, False, True])
    latest["rn"] = latest.groupby("user").cumcount() + 1
    want = latest[latest["rn"] <= 2][["user", "order_id", "amount", "rn"]].astype({"amount": "int64"})
    written = read_output(tmp_path / "out")
    got = current(pa.Table.from_pandas(written, preserve_index=False)).to_pandas()[list(want.columns)]
    by = ["user", "rn"]
    pd.testing.assert_frame_equal(got.sort_values(by, ignore_index=True), want.sort_values(by, ignore_index=True),
                                  check_dtype=False)  # fmt: skip
    assert (written["op"] == "-D").any()  # leaders deleted or beaten, their places refilled from below
    assert_replays(tmp_path / "out")


@pytest.mark.jvm
def test_deduplication_ties_go_as_in_flink_across_micro_batches(tmp_path: Path) -> None:
    """Each user has one row of the same event time in each of three micro-batches: keeping the
    first row keeps the first batch's, keeping the last the last batch's (Flink's
    RowTimeDeduplicateFunction: a later row of an equal time replaces the kept one)."""
    directory = tmp_path / "orders"
    users = [f"u{n}" for n in range(30)]
    write_parts(directory, (pd.DataFrame({"order_id": np.arange(30) + 100 * part, "user_id": users,
                                          "amount": np.full(30, float(part)), "ts": np.full(30, START, dtype="M8[us]")})
                            for part in range(3)))  # fmt: skip
    pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, "execution.checkpointing.interval": "0 s"})
    script = (
        f"CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, ts TIMESTAMP(3), WATERMARK FOR ts "
        f"AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'filesystem', 'path' = '{directory}', 'format' = "
        "'parquet', 'source.watch' = 'true', 'source.max-files-per-batch' = '1');\n"
    )
    for sink, order in (("first", "ts"), ("last", "ts DESC")):
        script += (
            f"CREATE TABLE {sink} (user_id STRING, order_id BIGINT) WITH ('connector' = 'filesystem', 'path' = "
            f"'{tmp_path / sink}', 'format' = 'parquet');\nINSERT INTO {sink} SELECT user_id, order_id FROM (SELECT "
            f"*, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY {order}) AS rn FROM orders) WHERE rn = 1;\n"
        )
    pipeline.sql(script)
    assert len(pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True).batches) == 3
    for sink, part in (("first", 0), ("last", 2)):
        got = current(pa.Table.from_pandas(read_output(tmp_path / sink), preserve_index=False)).to_pandas()
        assert sorted(got["order_id"]) == list(np.arange(30) + 100 * part), sink


@pytest.mark.jvm
def test_a_bounded_row_number_range_with_an_offset_equals_duckdb(tmp_path: Path) -> None:
    write_orders(tmp_path / "orders", files=1)
    query = (
        "SELECT user_id, order_id, rn FROM (SELECT user_id, order_id, ROW_NUMBER() OVER (PARTITION BY user_id ORDER "
        "BY amount DESC, order_id) AS rn FROM orders) WHERE rn BETWEEN 2 AND 3"
    )
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    pipeline.sql(
        f"CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, ts TIMESTAMP(3)) WITH ('connector' "
        f"= 'filesystem', 'path' = '{tmp_path / 'orders'}', 'format' = 'parquet');\n"
        f"CREATE TABLE out (user_id STRING, order_id BIGINT, rn BIGINT) WITH ('connector' = 'filesystem', 'path' = "
        f"'{tmp_path / 'out'}', 'format' = 'parquet');\nINSERT INTO out {query};"
    )
    pipeline.run()
    expected = duckdb.sql(query.replace("FROM orders", f"FROM '{tmp_path}/orders/*.parquet'")).df()
    assert_same_rows(read_output(tmp_path / "out"), expected, ["user_id", "rn"])


@pytest.mark.jvm
def test_a_ranked_view_or_with_query_is_each_readers_top_n(tmp_path: Path) -> None:
    """The numbering query as a view or a WITH query: each reader's filter makes its own Top-N
    (two readers of one view keep 1 and 2 rows per user, a WITH query 2), equal to DuckDB's."""
    write_orders(tmp_path / "orders", files=1)
    numbered = "SELECT user_id, order_id, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY amount DESC, order_id) AS rn"
    queries = {
        "top_two": f"WITH ranked AS ({numbered} FROM orders) SELECT user_id, order_id, rn FROM ranked WHERE rn <= 2",
        "top_one": "SELECT user_id, order_id, rn FROM best WHERE rn = 1",
        "best_two": "SELECT user_id, order_id, rn FROM best WHERE rn <= 2",
    }
    script = (f"CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, ts TIMESTAMP(3)) WITH "
              f"('connector' = 'filesystem', 'path' = '{tmp_path / 'orders'}', 'format' = 'parquet');\n"
              f"CREATE VIEW best AS {numbered} FROM orders;\n")  # fmt: skip
    for sink, query in queries.items():
        script += (f"CREATE TABLE {sink} (user_id STRING, order_id BIGINT, rn BIGINT) WITH ('connector' = "
                   f"'filesystem', 'path' = '{tmp_path / sink}', 'format' = 'parquet');\n"
                   f"INSERT INTO {sink} {query};\n")  # fmt: skip
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    pipeline.sql(script)
    assert sorted(n.limit for n in pipeline.operators.values() if isinstance(n, RankNode)) == [1, 2, 2]
    pipeline.run()
    orders = f"'{tmp_path}/orders/*.parquet'"
    for sink, query in queries.items():
        reference = query.replace("FROM orders", f"FROM {orders}").replace(
            "FROM best", f"FROM ({numbered} FROM {orders})"
        )
        assert_same_rows(read_output(tmp_path / sink), duckdb.sql(reference).df(), ["user_id", "rn"])
