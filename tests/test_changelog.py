"""Changelog sources keyed by primary key: upserts, deletes and row kinds, aggregated with
retraction, through restarts, rescales and a killed driver. Every answer is pandas replaying
the history of changes in order."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from keyflow import Log, Pipeline, log, parquet
from keyflow.changelog import DELETED, current
from keyflow.cli.app import app
from keyflow.errors import PlanError
from keyflow.plan.descriptors import ValueState
from keyflow.runtime.changelog import ROWS, SIGN, Normalize, Retracting, RetractingAggregate
from keyflow.runtime.streaming import FAULT_ENV
from keyflow.runtime.workers import view_kind
from keyflow.state.keyed import KeyedBatch, KeyedState
from keyflow.state.memory import KeyedStateStore
from tests.pipelines import TEST_SPARK
from tests.streams import read_output

ROOT = Path(__file__).resolve().parents[1]
# Arrow batches of 2 rows: the rows of one key span several batches of a worker.
TINY_ARROW_BATCHES = {"execution.checkpointing.interval": "0 s", "spark.sql.execution.arrow.maxRecordsPerBatch": "2"}
ORDERS = pa.schema([("order_id", pa.int64()), ("user_id", pa.string()), ("amount", pa.int64())])


def changes(seed: int, rows: int, keys: int, users: int = 300) -> pd.DataFrame:
    """Upserts of random orders (an update may move an order to another user); one in ten
    deletes its order (non-key columns null)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "order_id": rng.integers(0, keys, rows),
            "user_id": [f"user-{n}" for n in rng.integers(0, users, rows)],
            "amount": rng.integers(1, 1_000, rows),
        }
    )
    deleted = rng.random(rows) < 0.1
    frame["user_id"] = frame["user_id"].where(~deleted, None)
    frame["amount"] = frame["amount"].astype("Int64").where(~deleted, None)
    return frame


def append(path: Path, frame: pd.DataFrame, splits: int = 4) -> None:
    try:
        target = Log(path)
    except PlanError:
        target = Log.create(path, splits, ORDERS)
    target.append(pa.Table.from_pandas(frame, schema=ORDERS, preserve_index=False), key="order_id")


def replayed(history: list[pd.DataFrame]) -> pd.DataFrame:
    """Per user, over each order's latest version (deleted orders gone): what the SQL computes."""
    latest = pd.concat(history, ignore_index=True).groupby("order_id").tail(1)
    latest = latest[latest["user_id"].notna()].astype({"amount": "int64"})
    grouped = latest.groupby("user_id")["amount"]
    expected = pd.DataFrame(
        {"orders": grouped.size(), "revenue": grouped.sum(), "smallest": grouped.min(), "largest": grouped.max()}
    )
    total, count = grouped.sum(), grouped.size()  # Flink's AVG of a BIGINT: a BIGINT, truncated toward zero
    expected["mean"] = np.sign(total) * (total.abs() // count)
    return expected.reset_index().sort_values("user_id").reset_index(drop=True)


def script(base: Path) -> str:
    return f"""
SET 'spark.master' = 'local[2]';
SET 'pipeline.progress' = 'off';
SET 'execution.checkpointing.interval' = '0 s';
SET 'parallelism.default' = '2';
CREATE TABLE orders (order_id BIGINT, user_id STRING, amount BIGINT, PRIMARY KEY (order_id) NOT ENFORCED)
WITH ('connector' = 'upsert-log', 'path' = '{base / "log"}', 'scan.parallelism' = '3',
      'scan.rows-per-batch' = '12000');
CREATE TABLE per_user (user_id STRING, orders BIGINT, revenue BIGINT, smallest BIGINT, largest BIGINT,
                       mean DOUBLE, PRIMARY KEY (user_id) NOT ENFORCED)
WITH ('connector' = 'filesystem', 'path' = '{base / "out"}', 'format' = 'parquet');
INSERT INTO per_user
SELECT user_id, COUNT(*), SUM(amount), MIN(amount), MAX(amount), AVG(amount) FROM orders GROUP BY user_id;
"""


def run_sql(base: Path, parallelism: int, fault: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), FAULT_ENV: fault}
    command = [sys.executable, "-m", "keyflow", "sql", str(base / "job.sql"), "-p", str(parallelism)]
    command += ["--checkpoint", str(base / "ckpt"), "--available-now"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def table_now(base: Path) -> pd.DataFrame:
    changelog = pa.Table.from_pandas(read_output(base / "out"), preserve_index=False)
    return current(changelog).to_pandas().sort_values("user_id").reset_index(drop=True)


@pytest.mark.jvm
def test_upsert_changelog_survives_kill_restart_and_live_rescale(tmp_path: Path) -> None:
    """>= 10k keys, ~6 changes each, 6 micro-batches of 12,000 changes; source at 3, operators
    at 2; the driver killed with SIGKILL in batch 1, restarted at 4, rescaled live to 2."""
    (tmp_path / "job.sql").write_text(script(tmp_path))
    history = [changes(seed, 12_000, 12_000) for seed in range(6)]
    for part in history[:2]:
        append(tmp_path / "log", part)

    crashed = run_sql(tmp_path, 2, fault="after-sink-write:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    restarted = CliRunner().invoke(  # in this process, on the shared SparkSession
        app, ["sql", str(tmp_path / "job.sql"), "-p", "4", "--checkpoint", str(tmp_path / "ckpt"), "--available-now"]
    )
    assert restarted.exit_code == 0, restarted.output
    assert "parallelism 4" in restarted.stdout
    pd.testing.assert_frame_equal(table_now(tmp_path), replayed(history[:2]), check_dtype=False)

    pipeline = Pipeline(config={**TEST_SPARK, "parallelism.default": 4})
    pipeline.sql(script(tmp_path).replace("SET 'parallelism.default' = '2';", ""))
    job = pipeline.start(checkpoint=str(tmp_path / "ckpt"))
    try:
        for part in history[2:4]:
            append(tmp_path / "log", part)
        job.process_all_available()
        job.rescale(2, reason="test")
        for part in history[4:]:
            append(tmp_path / "log", part)
        job.process_all_available()
        assert job.last_batch is not None
        assert job.last_batch.parallelism == 2
        assert job.last_batch.batch >= 5  # 72,000 changes, at most 12,000 a batch (more batches: one caught an append)
    finally:
        job.stop()
    pd.testing.assert_frame_equal(table_now(tmp_path), replayed(history), check_dtype=False)


@pytest.mark.jvm
def test_changes_of_one_key_in_one_micro_batch_apply_in_order(tmp_path: Path) -> None:
    """Insert, update twice, delete and insert again, all in one micro-batch; the output is a
    consistent changelog (each retraction repeats a row added before)."""
    history = [
        pd.DataFrame(
            {
                "order_id": [1, 2, 1, 1, 2, 1, 3],
                "user_id": ["a", "b", "a", "b", None, "c", "a"],
                "amount": pd.array([10, 20, 11, 12, None, 13, 5], dtype="Int64"),
            }
        )
    ]
    append(tmp_path / "log", history[0], splits=2)
    pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, **TINY_ARROW_BATCHES})
    orders = pipeline.source(log(str(tmp_path / "log"), changelog_mode="upsert", primary_key="order_id"), 3)
    orders.sink(parquet(str(tmp_path / "rows")))
    orders.key_by("user_id").aggregate(total="sum(amount)", n="count(*)").sink(parquet(str(tmp_path / "out")))
    pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    rows = read_output(tmp_path / "rows").sort_values("order_id").reset_index(drop=True)
    assert rows.to_dict("records") == [
        {"order_id": 1, "user_id": "c", "amount": 13, "op": "+I"},
        {"order_id": 3, "user_id": "a", "amount": 5, "op": "+I"},
    ]  # one micro-batch: each key's newest version only (order 2 was inserted and deleted)
    totals = table_now(tmp_path).to_dict("records")
    assert totals == [{"user_id": "a", "total": 5, "n": 1}, {"user_id": "c", "total": 13, "n": 1}]


@pytest.mark.jvm
def test_changelog_format_log_with_row_kinds(tmp_path: Path) -> None:
    """A log whose rows carry +I/-U/+U/-D, read with and without a primary key, aggregated over
    micro-batches: the same answer as pandas applying the changes."""
    schema = pa.schema(
        [("order_id", pa.int64()), ("user_id", pa.string()), ("amount", pa.int64()), ("op", pa.string())]
    )
    target = Log.create(tmp_path / "log", 3, schema)
    batches = [
        [(1, "a", 10, "+I"), (2, "a", 5, "+I"), (3, "b", 7, "+I"), (5, "c", 9, "+I")],
        [(1, "a", 10, "-U"), (1, "b", 12, "+U"), (2, "a", 5, "-D"), (5, "c", 9, "-U")],  # a lone -U deletes
        [(4, "a", 1, "+I"), (3, "b", 7, "-U"), (3, "b", 8, "+U")],
    ]
    for rows in batches:
        target.append(pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema), "order_id")
    for primary_key, out in (("order_id", "keyed"), ((), "plain")):
        pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, **TINY_ARROW_BATCHES})
        source = log(str(tmp_path / "log"), rows_per_batch=4, changelog_mode="all", primary_key=primary_key)
        per_user = pipeline.source(source).key_by("user_id").aggregate(total="sum(amount)", top="max(amount)")
        per_user.sink(parquet(str(tmp_path / out)))
        pipeline.run(checkpoint=str(tmp_path / f"ckpt-{out}"), available_now=True)
        got = current(pa.Table.from_pandas(read_output(tmp_path / out), preserve_index=False)).to_pylist()
        assert sorted(got, key=lambda r: r["user_id"]) == [
            {"user_id": "a", "total": 1, "top": 1},
            {"user_id": "b", "total": 20, "top": 12},
        ]


def test_current_is_the_multiset_sum_in_any_order() -> None:
    changes_table = pa.table(
        {"k": ["x", "x", "x", "y", "y", "z"], "v": [1, 1, 3, 2, 2, 4], "op": ["+I", "-U", "+U", "+I", "-D", "+I"]}
    )
    order = np.random.default_rng(0).permutation(changes_table.num_rows)
    for table in (changes_table, changes_table.take(order)):
        assert sorted(current(table).to_pylist(), key=lambda r: r["k"]) == [{"k": "x", "v": 3}, {"k": "z", "v": 4}]
    with pytest.raises(PlanError, match=r"row 1 has op='\+X'; a row kind is one of \+I, -U, \+U, -D"):
        current(pa.table({"k": [1, 2], "op": ["+I", "+X"]}))


def _aggregate_calls(aggregates: list[Retracting], argument: pa.DataType) -> tuple[RetractingAggregate, Any]:
    """A retracting aggregate over its own in-memory state store, called as a worker would."""
    descriptors: dict[str, Any] = {ROWS: ValueState(pa.int64())}
    for aggregate in aggregates:
        descriptors.update(aggregate.state(None if aggregate.argument is None else argument))
    store = KeyedStateStore(descriptors)
    kinds = {name: view_kind(descriptor) for name, descriptor in descriptors.items()}
    function = RetractingAggregate(("k",), tuple(aggregates))

    def call(rows: list[tuple[str, int, Any]]) -> list[dict[str, Any]]:
        table = pa.table(
            {
                "k": [r[0] for r in rows],
                SIGN: pa.array([r[1] for r in rows], pa.int8()),
                "x": pa.array([r[2] for r in rows], argument),
            }
        ).sort_by([("k", "ascending")])
        batch = KeyedBatch.from_sorted(table, ("k",), np.zeros(table.num_rows, np.int32), 0)
        return function.process(batch, KeyedState(store, store.slots(batch.keys, batch.key_groups), kinds)).to_pylist()

    return function, (call, store)


def test_an_emptied_group_clears_its_state_and_ignores_stray_retractions() -> None:
    """As Flink's GroupAggFunction: when the last row of a group is retracted its state is
    cleared (no state left for the key), and a retraction of an empty group is ignored."""
    aggregates = [Retracting("n", "count", None), Retracting("s", "sum", "x"), Retracting("top", "max", "x")]
    _, (call, store) = _aggregate_calls(aggregates, pa.int64())
    assert call([("a", 1, 5)]) == [{"k": "a", "n": 1, "s": 5, "top": 5, "op": "+I"}]
    assert call([("a", -1, 5)]) == [{"k": "a", "n": 1, "s": 5, "top": 5, "op": "-D"}]
    assert len(store.live_slots()) == 0
    assert call([("a", -1, 5)]) == []  # a stray retraction of the empty group
    assert len(store.live_slots()) == 0
    assert call([("a", 1, 7)]) == [{"k": "a", "n": 1, "s": 7, "top": 7, "op": "+I"}]


def test_retracting_max_orders_nan_above_every_number_as_spark() -> None:
    _, (call, _) = _aggregate_calls([Retracting("top", "max", "x"), Retracting("low", "min", "x")], pa.float64())
    (inserted,) = call([("a", 1, float("nan")), ("a", 1, 1.0), ("a", 1, 2.0)])
    assert math.isnan(inserted["top"])
    assert inserted["low"] == 1.0
    before, after = call([("a", -1, float("nan"))])
    assert (before["op"], math.isnan(before["top"])) == ("-U", True)
    assert after == {"k": "a", "top": 2.0, "low": 1.0, "op": "+U"}


def test_a_deleted_key_leaves_no_normalize_state() -> None:
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    store = KeyedStateStore(Normalize.state(schema, ("id",)))
    kinds = {name: view_kind(descriptor) for name, descriptor in store.descriptors.items()}
    normalize = Normalize(("id",), ("v",))

    def call(rows: list[tuple[int, str | None, bool]]) -> list[dict[str, Any]]:
        columns = {"id": [r[0] for r in rows], "v": [r[1] for r in rows], DELETED: [r[2] for r in rows]}
        table = pa.table(columns, schema=schema.append(pa.field(DELETED, pa.bool_())))
        batch = KeyedBatch.from_sorted(table, ("id",), np.zeros(table.num_rows, np.int32), 0)
        return normalize.process(batch, KeyedState(store, store.slots(batch.keys, batch.key_groups), kinds)).to_pylist()

    assert call([(1, "a", False)]) == [{"id": 1, "v": "a", "op": "+I"}]
    assert call([(1, "a", False)]) == []  # an upsert equal to the stored row: nothing
    assert call([(1, None, True)]) == [{"id": 1, "v": "a", "op": "-D"}]
    assert len(store.live_slots()) == 0
    assert call([(1, None, True)]) == []  # the delete of an unknown key: nothing
