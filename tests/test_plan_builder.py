"""SQL and the Python API build through one plan builder: the same query is the same logical
node with the same checks. Not marked ``jvm``: the test plugin refuses Spark and Java to
these tests, so passing proves no JVM started."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from keyflow import Log, Pipeline, Stream, datagen, log, random_int
from keyflow.errors import PlanError
from keyflow.plan import nodes

ORDERS = pa.schema([("order_id", pa.int64()), ("user_id", pa.string()), ("amount", pa.int64()), ("op", pa.string())])


def bounded(path: Path) -> Any:
    return datagen(rows=10, fields={"user_id": random_int(0, 3), "amount": random_int(0, 9)})


def changelog(path: Path) -> Any:
    Log.create(path / "log", 2, ORDERS)
    return log(str(path / "log"), changelog_mode="all", primary_key="order_id")


def orders(source: Any) -> tuple[Pipeline, Stream]:
    """A pipeline reading ``source``, registered as the SQL view ``orders``."""
    pipeline = Pipeline(parallelism=2)
    stream = pipeline.source(source)
    pipeline.create_temporary_view("orders", stream)
    return pipeline, stream


def sql_aggregate(pipeline: Pipeline, query: str) -> nodes.Node:
    """The aggregate node under the select list of a bare SQL ``query``."""
    result = pipeline.sql(query)
    assert result is not None
    return pipeline.operators[result.node.inputs[0]]


def logical(node: nodes.Node) -> tuple[Any, ...]:
    """What an aggregate is, whatever the front end: its names aside (SQL names them ``__agg<i>``)."""
    assert isinstance(node, nodes.AggregateNode)
    flags = (node.changelog, node.changelog_input, node.reinterpreted, node.on_null)
    return (node.kind, node.inputs, node.keys, tuple(node.aggregations.values()), *flags)


@pytest.mark.parametrize("source", [bounded, changelog], ids=["bounded", "changelog"])
def test_a_sql_group_by_is_the_python_aggregate(source: Callable[[Path], Any], tmp_path: Path) -> None:
    pipeline, stream = orders(source(tmp_path))
    query = "SELECT user_id, COUNT(*) AS n, SUM(amount) AS total FROM orders GROUP BY user_id"
    from_sql = sql_aggregate(pipeline, query)
    from_python = stream.key_by("user_id").aggregate(n="COUNT(*)", total="SUM(amount)").node
    assert logical(from_sql) == logical(from_python)


def test_a_streaming_sql_group_by_emits_a_changelog_over_inserts(tmp_path: Path) -> None:
    """The one intended difference (Flink's): SQL retracts a key's previous row, the Python
    aggregate emits each changed key's new row."""
    Log.create(tmp_path / "log", 2, ORDERS.remove(ORDERS.get_field_index("op")))
    pipeline, stream = orders(log(str(tmp_path / "log")))
    from_sql = sql_aggregate(pipeline, "SELECT user_id, SUM(amount) AS total FROM orders GROUP BY user_id")
    from_python = stream.key_by("user_id").aggregate(total="SUM(amount)").node
    assert isinstance(from_sql, nodes.AggregateNode)
    assert isinstance(from_python, nodes.AggregateNode)
    assert (from_sql.changelog, from_python.changelog) == (True, False)
    assert (from_sql.changelog_input, from_python.changelog_input) == (False, False)


def test_an_invalid_aggregate_is_the_same_plan_error_from_sql_and_python(tmp_path: Path) -> None:
    """Over a changelog an aggregate retracts rows, so it takes one argument: both front ends
    are refused with one message when the plan compiles, before any Spark."""
    source = changelog(tmp_path)
    pipeline, _ = orders(source)
    pipeline.sql("SELECT user_id, COUNT(amount, order_id) AS n FROM orders GROUP BY user_id")
    with pytest.raises(PlanError) as from_sql:
        pipeline.plan()
    pipeline, stream = orders(source)
    stream.key_by("user_id").aggregate(__agg0="COUNT(amount, order_id)").set_name("aggregate (query)")
    with pytest.raises(PlanError) as from_python:
        pipeline.plan()
    assert str(from_sql.value) == str(from_python.value)
    assert "aggregate __agg0='COUNT(amount, order_id)' is not supported over a changelog" in str(from_sql.value)


def test_views_live_in_the_sql_catalog_of_their_pipeline(tmp_path: Path) -> None:
    pipeline, stream = orders(bounded(tmp_path))
    with pytest.raises(PlanError, match="a table or view named 'orders' exists already"):
        pipeline.create_temporary_view("orders", stream)
    other, _ = orders(bounded(tmp_path))  # another pipeline: its own catalog
    with pytest.raises(PlanError, match="view name 'no view' must be an identifier"):
        other.create_temporary_view("no view", stream)
