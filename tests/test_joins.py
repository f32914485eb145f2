"""Regular joins (``Stream.join``): every matching pair once, whatever order rows arrive in;
outer joins as a changelog whose current table is the batch join after every micro-batch
(a padded row is retracted when its first match arrives, as Flink does). The reference is
pandas' merge of the same rows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keyflow import Log, Pipeline, files, parquet, tumbling
from keyflow.changelog import current
from keyflow.connectors.streams import log
from keyflow.errors import DataError, PlanError
from keyflow.runtime.connected import INPUT, PACKED
from keyflow.runtime.joins import ROW_KIND, ChangelogJoinRows, JoinRows, JoinSides
from keyflow.runtime.workers import view_kind
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.inspect import describe_checkpoint
from keyflow.state.keyed import KeyedBatch, KeyedState
from keyflow.state.memory import KeyedStateStore
from tests.streams import append, config, write_files

ORDERS = pa.schema([("user", pa.string()), ("order_id", pa.int64()), ("amount", pa.int64())])
VISITS = pa.schema([("uid", pa.string()), ("visit", pa.int64())])
HOW = ("inner", "left", "right", "full")


def orders(rows: int, users: int, start: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    users_of = [f"u{n}" for n in rng.integers(0, users, rows)]
    return pd.DataFrame(
        {"user": users_of, "order_id": np.arange(start, start + rows), "amount": rng.integers(1, 99, rows)}
    )


def visits(rows: int, first_user: int, users: int, start: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    users_of = [f"u{n}" for n in rng.integers(first_user, first_user + users, rows)]
    return pd.DataFrame({"uid": users_of, "visit": np.arange(start, start + rows)})


COLUMNS = ("user", "order_id", "amount", "visit")


def expected(left: pd.DataFrame, right: pd.DataFrame, how: str, columns: tuple[str, ...] = COLUMNS) -> pd.DataFrame:
    """pandas' join, keys named as the left input's (a right-only row keeps its key)."""
    joined = left.merge(right, left_on="user", right_on="uid", how="outer" if how == "full" else how)
    joined["user"] = joined["user"].fillna(joined["uid"])
    return tidy(joined[list(columns)])


def tidy(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.astype({c: "Int64" for c in ("order_id", "amount", "visit", "pages") if c in frame.columns})
    return frame.sort_values(["user", "order_id", "visit"]).reset_index(drop=True)


def output(path: Path, how: str, columns: tuple[str, ...] = COLUMNS) -> pd.DataFrame:
    """A join's output files as its current table (a changelog's: after checking no row is
    retracted more often than it was added)."""
    files_ = sorted(p for p in path.glob("part-*") if p.is_file())
    rows = pa.concat_tables([pq.read_table(f) for f in files_]) if files_ else None
    if rows is None:
        return tidy(pd.DataFrame({c: [] for c in columns}))
    if "op" in rows.column_names:
        assert set(rows.column("op").to_pylist()) <= {"+I", "-D"}
        changes = rows.to_pandas()
        signed = changes.assign(n=np.where(changes.op == "-D", -1, 1)).drop(columns="op")
        net = signed.groupby([c for c in signed.columns if c != "n"], dropna=False).n.sum()
        assert (net >= 0).all(), f"{how}: a row retracted more often than emitted: {net[net < 0]}"
        rows = current(rows)
    return tidy(rows.to_pandas()[list(columns)])


def joins(p: Pipeline, left: object, right: object, out: Path) -> None:
    a, b = p.source(left, uid="orders"), p.source(right, uid="visits")
    for how in HOW:
        a.join(b, on=[("user", "uid")], how=how).uid(f"{how}-join").sink(parquet(out / how), uid=f"{how}-out")


@pytest.mark.jvm
def test_batch_joins_equal_pandas(tmp_path: Path) -> None:
    left, right = orders(600, 40, start=0, seed=1), visits(500, 20, 40, start=0, seed=2)  # users 0..19 / 20..59
    write_files(tmp_path / "orders", left, ORDERS)
    write_files(tmp_path / "visits", right, VISITS)
    p = Pipeline(config=config(3))
    joins(p, files(str(tmp_path / "orders")), files(str(tmp_path / "visits")), tmp_path / "out")
    p.run()
    for how in HOW:
        pd.testing.assert_frame_equal(output(tmp_path / "out" / how, how), expected(left, right, how), obj=how)


@pytest.mark.jvm
def test_streaming_outer_joins_equal_the_batch_join_after_every_micro_batch(tmp_path: Path) -> None:
    """Rows of a key arrive on either side first, in separate micro-batches; a live rescale and
    a restart at another parallelism come while the state holds unmatched rows."""
    out = tmp_path / "out"
    Log.create(tmp_path / "orders", 3, ORDERS)
    Log.create(tmp_path / "visits", 3, VISITS)
    p = Pipeline(config=config(2))
    joins(p, log(str(tmp_path / "orders")), log(str(tmp_path / "visits")), out)
    seen_orders, seen_visits = [], []
    rounds = [
        (orders(200, 30, start=0, seed=3), visits(50, 10, 30, start=0, seed=4)),
        (orders(150, 50, start=1_000, seed=5), visits(300, 0, 60, start=1_000, seed=6)),
        (orders(100, 70, start=2_000, seed=7), visits(0, 0, 1, start=2_000, seed=8)),
        (orders(0, 1, start=3_000, seed=9), visits(200, 40, 40, start=3_000, seed=10)),
    ]
    job = None
    try:
        for number, (left, right) in enumerate(rounds):
            if number == 3:  # restart at parallelism 1 from the checkpoint
                job.stop()
                p = Pipeline(config=config(1))
                joins(p, log(str(tmp_path / "orders")), log(str(tmp_path / "visits")), out)
                job = None
            if len(left):
                append(tmp_path / "orders", left, schema=ORDERS, key="user")
            if len(right):
                append(tmp_path / "visits", right, schema=VISITS, key="uid")
            seen_orders.append(left)
            seen_visits.append(right)
            job = job or p.start(checkpoint=str(tmp_path / "ckpt"))
            if number == 2:
                job.rescale(3)
            job.process_all_available()
            all_left, all_right = pd.concat(seen_orders), pd.concat(seen_visits)
            for how in HOW:
                got = output(out / how, how)
                pd.testing.assert_frame_equal(got, expected(all_left, all_right, how), obj=f"{how} after {number}")
    finally:
        if job is not None:
            job.stop()
    retracted = pq.read_table(out / "full", columns=["op"]).column("op").to_pylist()
    assert retracted.count("-D") > 50  # padded rows were emitted, then retracted by their first match


def upserts(seed: int, rows: int, ids: int, users: int, id_column: str, user_column: str, value: str) -> pd.DataFrame:
    """Upserts of ``ids`` rows: an update may move a row to another user; one in six deletes
    its row (non-key columns null)."""
    rng = np.random.default_rng(seed)
    deleted = rng.random(rows) < 1 / 6
    users_of = pd.Series([f"u{n}" for n in rng.integers(0, users, rows)]).where(~deleted, None)
    values = pd.Series(rng.integers(1, 99, rows)).astype("Int64").where(~deleted, None)
    return pd.DataFrame({id_column: rng.integers(0, ids, rows), user_column: users_of, value: values})


def latest(history: list[pd.DataFrame], id_column: str, user_column: str) -> pd.DataFrame:
    """Each id's newest version, deleted ids gone: the table a changelog source describes."""
    newest = pd.concat(history, ignore_index=True).groupby(id_column).tail(1)
    return newest[newest[user_column].notna()]


def changelog_joins(p: Pipeline, base: Path) -> None:
    a = p.source(log(str(base / "orders"), changelog_mode="upsert", primary_key="order_id"), uid="orders")
    b = p.source(log(str(base / "visits"), changelog_mode="upsert", primary_key="visit"), uid="visits")
    for how in HOW:
        a.join(b, on=[("user", "uid")], how=how).uid(f"{how}-join").sink(parquet(base / "out" / how), uid=f"{how}-out")


@pytest.mark.jvm
def test_streaming_joins_of_changelogs_equal_the_join_of_the_current_tables_after_every_micro_batch(
    tmp_path: Path,
) -> None:
    """Both inputs are upsert logs (normalized into changelogs): rows are updated, moved to
    another user (a retraction at one key, an addition at another) and deleted, across
    micro-batches, over a restart at another parallelism. After each micro-batch the current
    table of each join's output equals pandas' join of the inputs' current tables, and no row
    is retracted more often than it was added (Flink's StreamingJoinOperator with retractions)."""
    order_schema = pa.schema([("order_id", pa.int64()), ("user", pa.string()), ("amount", pa.int64())])
    visit_schema = pa.schema([("visit", pa.int64()), ("uid", pa.string()), ("pages", pa.int64())])
    rounds = [
        (upserts(21, 300, 150, 25, "order_id", "user", "amount"), upserts(22, 200, 90, 25, "visit", "uid", "pages")),
        (upserts(23, 250, 150, 25, "order_id", "user", "amount"), upserts(24, 0, 90, 25, "visit", "uid", "pages")),
        (upserts(25, 200, 150, 30, "order_id", "user", "amount"), upserts(26, 250, 90, 30, "visit", "uid", "pages")),
    ]
    seen_orders: list[pd.DataFrame] = []
    seen_visits: list[pd.DataFrame] = []
    Log.create(tmp_path / "orders", 3, order_schema)
    Log.create(tmp_path / "visits", 3, visit_schema)
    job, p = None, Pipeline(config=config(2))
    changelog_joins(p, tmp_path)
    try:
        for number, (left, right) in enumerate(rounds):
            if number == 2:  # restart at parallelism 3 from the checkpoint
                job.stop()
                p, job = Pipeline(config=config(3)), None
                changelog_joins(p, tmp_path)
            append(tmp_path / "orders", left, schema=order_schema, key="order_id")
            if len(right):
                append(tmp_path / "visits", right, schema=visit_schema, key="visit")
            seen_orders.append(left)
            seen_visits.append(right)
            job = job or p.start(checkpoint=str(tmp_path / "ckpt"))
            job.process_all_available()
            now_orders, now_visits = latest(seen_orders, "order_id", "user"), latest(seen_visits, "visit", "uid")
            for how in HOW:
                columns = (*COLUMNS, "pages")
                want = expected(now_orders, now_visits, how, columns)
                got = output(tmp_path / "out" / how, how, columns)
                pd.testing.assert_frame_equal(got, want, obj=f"{how} after {number}")
    finally:
        if job is not None:
            job.stop()
    kinds = pq.read_table(tmp_path / "out" / "inner", columns=["op"]).column("op").to_pylist()
    assert kinds.count("-D") > 100  # updates and deletes retracted joined rows


def test_a_changelog_join_retracts_before_it_adds_and_keeps_no_state_for_an_emptied_key() -> None:
    """An update of a joined row is emitted as its old row's ``-D`` before its new row's
    ``+I`` (an upsert sink by ``order_id`` would otherwise delete the new row); once every row
    of a key is retracted, the key holds no state."""
    orders = pa.struct([("order_id", pa.int64()), ("amount", pa.int64())])
    visits = pa.struct([("visit", pa.int64())])
    sides = JoinSides((True, False), (orders, visits), (("order_id", "amount"), ("visit",)), changelog=True)
    schema = pa.schema([("user", pa.string()), ("order_id", pa.int64()), ("amount", pa.int64()),
                        ("visit", pa.int64()), ("op", pa.string())])  # fmt: skip
    join, store = ChangelogJoinRows(sides, schema), KeyedStateStore(JoinRows.state_of(sides))
    kinds = {name: view_kind(descriptor) for name, descriptor in store.descriptors.items()}

    def call(*rows: tuple[int, str, dict[str, int]]) -> list[tuple[Any, ...]]:
        table = pa.table(
            {"user": ["u1"] * len(rows), INPUT: pa.array([side for side, _, _ in rows], pa.int8()),
             PACKED[0]: pa.array([row if side == 0 else None for side, _, row in rows], orders),
             PACKED[1]: pa.array([row if side == 1 else None for side, _, row in rows], visits),
             ROW_KIND: [kind for _, kind, _ in rows]}
        )  # fmt: skip
        batch = KeyedBatch.from_sorted(table, ("user",), np.zeros(table.num_rows, np.int32), 0)
        out = join.process(batch, KeyedState(store, store.slots(batch.keys, batch.key_groups), kinds))
        return [] if out is None else [tuple(row.values()) for row in out.to_pylist()]

    assert call((0, "+I", {"order_id": 1, "amount": 10})) == [("u1", 1, 10, None, "+I")]
    assert call((1, "+I", {"visit": 7})) == [("u1", 1, 10, None, "-D"), ("u1", 1, 10, 7, "+I")]
    updated = call((0, "-U", {"order_id": 1, "amount": 10}), (0, "+U", {"order_id": 1, "amount": 20}))
    assert updated == [("u1", 1, 10, 7, "-D"), ("u1", 1, 20, 7, "+I")]
    again = call((0, "+U", {"order_id": 1, "amount": 30}), (0, "-U", {"order_id": 1, "amount": 30}))
    assert again == []  # added and retracted in one call: nothing left to emit
    gone = call((0, "-D", {"order_id": 1, "amount": 20}), (1, "-D", {"visit": 7}))
    assert gone == [("u1", 1, 20, 7, "-D")]
    assert len(store.live_slots()) == 0


@pytest.mark.jvm
def test_null_join_keys_fail_naming_both_inputs_and_the_way_out(tmp_path: Path) -> None:
    left = orders(20, 5, start=0, seed=11)
    left.loc[3, "user"] = None
    write_files(tmp_path / "orders", left, ORDERS)
    write_files(tmp_path / "visits", visits(20, 0, 5, start=0, seed=12), VISITS)
    p = Pipeline(config=config(2))
    a, b = p.source(files(str(tmp_path / "orders"))), p.source(files(str(tmp_path / "visits")))
    a.join(b, on=[("user", "uid")], how="left").sink(parquet(tmp_path / "out"))
    with pytest.raises(DataError, match=r"1 of 40 rows of its two inputs have a null in key column\(s\) \['user'\] / "
                       r"\['uid'\]; filter them out first or set pipeline.null-keys=drop"):  # fmt: skip
        p.run()


def test_join_mistakes_are_plan_errors(tmp_path: Path) -> None:
    Log.create(tmp_path / "o", 2, ORDERS)
    Log.create(tmp_path / "v", 2, VISITS)
    p = Pipeline()
    a, b = p.source(log(str(tmp_path / "o")), name="orders"), p.source(log(str(tmp_path / "v")), name="visits")
    with pytest.raises(PlanError, match="join how='outer' is not a join type; choose one of inner, left, right, full"):
        a.join(b, on=[("user", "uid")], how="outer")
    with pytest.raises(PlanError, match=r"join on=\[\('user',\)\]: name the columns to match"):
        a.join(b, on=[("user",)])  # type: ignore[list-item]
    with pytest.raises(PlanError, match=r"both streams have column\(s\) \['order_id'\] besides the keys"):
        a.join(a.select("user AS u", "order_id"), on=[("user", "u")])
    a.join(b, on=[("amount", "uid")]).sink(parquet(tmp_path / "x"))
    with pytest.raises(PlanError, match=r"key 'amount' of 'orders' is numeric but key 'uid' of 'visits' is string"):
        p.plan()
    with pytest.raises(PlanError, match=r"names \['user'\] twice; name each column once"):
        a.join(b, on=["user", "user"])
    upserts = p.source(log(str(tmp_path / "o"), changelog_mode="upsert", primary_key="order_id"), name="upserts")
    with pytest.raises(PlanError, match=r"'normalize upserts' is a changelog .*a time-bounded join takes streams of"):
        upserts.interval_join(b, on=[("user", "uid")], between=("-1 s", "1 s"), how="left")
    joined = a.join(b, on=[("user", "uid")])
    with pytest.raises(PlanError, match=r"window\(\.\.\.\) over the output of join 'inner join' is not supported"):
        joined.key_by("user").window(tumbling("1 min"))
    p = Pipeline()
    a, b = p.source(log(str(tmp_path / "o")), name="orders"), p.source(log(str(tmp_path / "v")), name="visits")
    a.join(b, on="user").sink(parquet(tmp_path / "y"))
    with pytest.raises(PlanError, match=r"the second stream \('visits'\) has no key column\(s\) \['user'\]"):
        p.plan()


@pytest.mark.jvm
def test_state_ttl_forgets_the_rows_of_idle_keys(tmp_path: Path) -> None:
    """``table.exec.state.ttl``: rows of a key not written for the TTL never join again and,
    after a compaction, are gone from the checkpoint; keys written since keep theirs."""
    Log.create(tmp_path / "orders", 2, ORDERS)
    Log.create(tmp_path / "visits", 2, VISITS)

    def run(left: pd.DataFrame, right: pd.DataFrame) -> list[dict[str, object]]:
        append(tmp_path / "orders", left, schema=ORDERS, key="user")
        append(tmp_path / "visits", right, schema=VISITS, key="uid")
        p = Pipeline(config=config(2, **{"table.exec.state.ttl": "1 s", "state.compaction.max-deltas": 1}))
        a, b = p.source(log(str(tmp_path / "orders")), uid="orders"), p.source(log(str(tmp_path / "visits")), uid="v")
        a.join(b, on=[("user", "uid")]).uid("join").sink(parquet(tmp_path / "out"), uid="out")
        p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
        return describe_checkpoint(Checkpoint(str(tmp_path / "ckpt")))["operators"]

    first = orders(40, 10, start=0, seed=13)  # users u0..u9
    assert run(first, visits(0, 0, 1, start=0, seed=14))[0]["keys_stored"] == first.user.nunique()
    time.sleep(1.5)
    late_visits = visits(30, 0, 5, start=0, seed=15)  # u0..u4: their orders are idle past the TTL
    new = pd.DataFrame({"user": ["u20"], "order_id": [99], "amount": [5]})
    operators = run(new, pd.concat([late_visits, pd.DataFrame({"uid": ["u20"], "visit": [99]})]))
    got = output(tmp_path / "out", "inner")
    assert got[["user", "order_id", "visit"]].values.tolist() == [["u20", 99, 99]]  # no order of u0..u9 joined
    assert operators[0]["keys_stored"] == late_visits.uid.nunique() + 1  # u5..u9 dropped; u0..u4 hold visits
