"""The columns each operator outputs, where the plan can tell without Spark; the checks on them.

Sources that know their columns before reading (the log, datagen) let
the plan find a misspelt key, ``order_by`` or aggregate column before a SparkSession starts.
Where an operator's output cannot be told (a ``map_batches`` without a schema, a select of
computed expressions Spark names itself), nothing after it is checked here: Spark checks it.
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlglot
from sqlglot import exp

from keyflow.changelog import OP
from keyflow.connectors.base import KnowsColumns
from keyflow.plan.aggregates import parse_aggregations
from keyflow.plan.nodes import (
    AggregateNode,
    FilterNode,
    KeyedNode,
    MapBatchesNode,
    Node,
    NormalizeNode,
    ProcessNode,
    SelectNode,
    SourceNode,
    WithColumnsNode,
)
from keyflow.schemas import ddl_names

Columns = tuple[str, ...] | None  # None: not known before Spark runs


def output_columns(nodes: Mapping[int, Node], node_id: int, known: dict[int, Columns]) -> Columns:
    """The columns ``node_id`` outputs, or None; ``known`` caches what was found."""
    if node_id not in known:
        known[node_id] = _output(nodes, nodes[node_id], known)
    return known[node_id]


def _output(nodes: Mapping[int, Node], node: Node, known: dict[int, Columns]) -> Columns:
    if isinstance(node, SourceNode):
        return node.source.column_names() if isinstance(node.source, KnowsColumns) else None
    if isinstance(node, (MapBatchesNode, ProcessNode)):
        return ddl_names(node.schema)
    upstream = output_columns(nodes, node.inputs[0], known) if node.inputs else None
    if upstream is None:
        return None
    if isinstance(node, FilterNode):
        return upstream
    if isinstance(node, WithColumnsNode):
        return (*upstream, *(name for name in node.columns if name not in upstream))
    if isinstance(node, SelectNode):
        return _selected(node.expressions, upstream)
    if isinstance(node, AggregateNode):
        return (*node.keys, *node.aggregations, *((OP,) if node.changelog else ()))
    if isinstance(node, NormalizeNode):
        return None  # internal columns (offsets, deletes) are dropped at run time
    return upstream


def _selected(expressions: tuple[str, ...], upstream: tuple[str, ...]) -> Columns:
    names: list[str] = []
    spelled = {name.lower(): name for name in upstream}  # Spark keeps the input's spelling
    for expression in expressions:
        try:
            tree = sqlglot.parse_one(expression, read="spark")
        except sqlglot.errors.SqlglotError:
            return None
        if isinstance(tree, exp.Star):
            names.extend(upstream)
        elif isinstance(tree, exp.Alias):
            names.append(tree.alias)
        elif isinstance(tree, exp.Column) and not tree.is_star and not tree.table:
            names.append(spelled.get(tree.name.lower(), tree.name))
        else:
            return None  # s.*, s.field, computed: named by Spark
    return tuple(names)


def column_problems(nodes: Mapping[int, Node], ordered: list[Node]) -> list[str]:
    """Key, ``order_by`` and aggregate columns missing from what reaches their operator."""
    known: dict[int, Columns] = {}
    problems: list[str] = []
    for node in ordered:
        if not isinstance(node, KeyedNode) or isinstance(node, NormalizeNode):
            continue
        available = output_columns(nodes, node.inputs[0], known)
        if available is None:
            continue
        missing_keys = [key for key in node.keys if key not in available]
        if missing_keys:
            problems.append(missing_key_message(node, missing_keys, available))
        if isinstance(node, ProcessNode):
            problems.extend(missing_order_by_message(node, c, available) for c in node.order_by if c not in available)
        if isinstance(node, AggregateNode):
            problems.extend(_aggregate_problems(node, available))
    return problems


def _aggregate_problems(node: AggregateNode, available: tuple[str, ...]) -> list[str]:
    calls = parse_aggregations(node.aggregations)  # an unreadable one reads no known columns
    lowered = {name.lower() for name in available}  # Spark resolves columns case-insensitively
    return [
        f"operator {node.name!r}: aggregate {call.name}={call.expression!r} reads column(s) {missing}, which "
        f"are not among its input's columns {list(available)}"
        for call in calls
        if (missing := sorted(c for c in call.columns if c.lower() not in lowered))
    ]


def missing_key_message(node: KeyedNode, missing: list[str], available: tuple[str, ...] | list[str]) -> str:
    """The error for key columns that are not in an operator's input."""
    if node.reinterpreted:
        return (
            f"operator {node.name!r}: reinterpret_as_keyed column(s) {missing} are not in the rows of the operator "
            f"before it ({list(available)}); keep the key columns in its output, or use key_by(...)"
        )
    return f"operator {node.name!r}: key_by column(s) {missing} not found; available columns: {list(available)}"


def missing_order_by_message(node: ProcessNode, column: str, available: tuple[str, ...] | list[str]) -> str:
    return f"operator {node.name!r}: order_by column {column!r} not found in {list(available)}"
