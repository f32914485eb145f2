"""The SQL types keyflow knows before Spark starts, and Flink's meanings that need them.

Flink divides two integers as integers (``7 / 2`` is 3, truncated toward zero, typed as the
wider operand); Spark's ``/`` always gives a DOUBLE. Where both operands are known to be
integers (columns declared so, integer literals, CASTs, and arithmetic, aggregates and
projections of those, followed through the plan), keyflow writes the division as Spark's
``DIV`` cast to the wider type. Where a type is not known the division stays Spark's. Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TypeGuard

import sqlglot
from sqlglot import exp

from keyflow.plan import nodes
from keyflow.plan.aggregates import parse_aggregations, parse_expression
from keyflow.plan.builder import PlanBuilder
from keyflow.sql.functions import mark_string_date_format
from keyflow.sql.statements import DIALECT, CreateTable

Types = dict[str, exp.DataType]  # column (lower case) -> its type
INTEGERS = (exp.DType.TINYINT, exp.DType.SMALLINT, exp.DType.INT, exp.DType.BIGINT)
FLOATS = (exp.DType.FLOAT, exp.DType.DOUBLE)
TIMESTAMP = exp.DataType.build("TIMESTAMP")
TIMES = (exp.DType.TIMESTAMP, exp.DType.TIMESTAMPTZ, exp.DType.TIMESTAMPLTZ, exp.DType.DATETIME, exp.DType.DATE)


@functools.lru_cache(maxsize=512)
def declared(text: str) -> exp.DataType | None:
    """A type as a table declares it (``BIGINT``, ``TIMESTAMP(3)``); None if sqlglot cannot read it."""
    try:
        return exp.DataType.build(text, dialect=DIALECT)
    except (sqlglot.errors.SqlglotError, ValueError):
        return None


def infer(tree: exp.Expr, types: Mapping[str, exp.DataType], spark: bool = False) -> exp.DataType | None:
    """The type of ``tree`` over columns of ``types``, where keyflow can tell (else None):
    by Flink's rules for a script's expression, by Spark's (``spark``) for one an operator
    holds, which Spark evaluates (its ``/`` and AVG are DOUBLE; the SQL planner has written
    Flink's integer division and AVG out as DIV and CASTs there)."""
    if isinstance(tree, (exp.Paren, exp.Alias, exp.Neg, exp.Window)):
        return infer(tree.this, types, spark)
    if isinstance(tree, exp.Distinct) and len(tree.expressions) == 1:
        return infer(tree.expressions[0], types, spark)
    if isinstance(tree, exp.Column) and not tree.table:
        return types.get(tree.name.lower())
    if isinstance(tree, exp.Literal) and tree.is_string:
        return exp.DataType.build("STRING")
    if isinstance(tree, exp.Literal) and not tree.is_string:
        text = str(tree.this)
        if text.isdigit() and int(text) < 2**63:  # larger: a DECIMAL in Calcite
            return exp.DataType.build("INT" if int(text) < 2**31 else "BIGINT")
        return None
    if isinstance(tree, (exp.Cast, exp.TryCast)):
        return tree.to
    if isinstance(tree, (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.Div, exp.IntDiv)):
        left, right = infer(tree.this, types, spark), infer(tree.expression, types, spark)
        divides = isinstance(tree, exp.Div) and spark
        if _integer(left) and _integer(right) and not divides:
            return _wider(left, right) if not isinstance(tree, exp.IntDiv) else exp.DataType.build("BIGINT")
        if _numeric(left) and _numeric(right) and (_float(left) or _float(right) or isinstance(tree, exp.Div)):
            return exp.DataType.build("DOUBLE")
        return None
    if isinstance(tree, exp.Count):
        return exp.DataType.build("BIGINT")
    if isinstance(tree, exp.Avg):  # Flink's: an integer's mean is that integer type (as the SQL planner reads it back)
        argument = infer(tree.this, types, spark)
        return argument if _integer(argument) and not spark else exp.DataType.build("DOUBLE")
    if isinstance(tree, exp.Sum):
        argument = infer(tree.this, types, spark)
        return exp.DataType.build("BIGINT") if _integer(argument) else argument if _float(argument) else None
    if isinstance(tree, (exp.Min, exp.Max)):
        return infer(tree.this, types, spark)
    return None


def integer_type(tree: exp.Expr, types: Mapping[str, exp.DataType]) -> exp.DataType | None:
    """The integer type of ``tree`` where keyflow can tell it is one, else None."""
    kind = infer(tree, types)
    return kind if _integer(kind) else None


def typed_meanings(tree: exp.Expr, types: Mapping[str, exp.DataType]) -> exp.Expr:
    """``tree`` (changed in place) with Flink's meanings that need the operands' types: each
    division of two integers written as Flink computes it, innermost first (``a / 2 / 3``
    divides the integer ``a / 2``), and each ``DATE_FORMAT`` of a STRING marked as such."""
    for child in list(tree.iter_expressions()):
        child.replace(typed_meanings(child, types))
    if isinstance(tree, exp.Anonymous) and tree.expressions and _string(infer(tree.expressions[0], types)):
        mark_string_date_format(tree)
    if not isinstance(tree, exp.Div):
        return tree
    left, right = infer(tree.this, types), infer(tree.expression, types)
    if not (_integer(left) and _integer(right)):
        return tree
    whole = exp.IntDiv(this=exp.paren(tree.this.copy()), expression=exp.paren(tree.expression.copy()))
    return exp.Cast(this=whole, to=_wider(left, right))


def table_types(table: CreateTable) -> Types:
    """A table's declared column types and those of its computed columns keyflow can tell."""
    types = _physical_types(table)
    for name, expression in table.computed:
        kind = _typed(expression, types)
        if kind is not None:
            types[name.lower()] = kind
    return types


def node_types(builder: PlanBuilder, node_id: int, tables: Mapping[int, Types]) -> Types:
    """The types of the columns of ``node_id``'s rows that keyflow can tell, from the tables'
    declared ones (``tables``: by the node reading each) through the operators after them."""
    if node_id in tables:
        return dict(tables[node_id])
    node = builder.node(node_id)
    inputs = [node_types(builder, input_id, tables) for input_id in node.inputs]
    if isinstance(node, (nodes.FilterNode, nodes.WithColumnsNode)):
        extra = node.columns if isinstance(node, nodes.WithColumnsNode) else {}
        return {**inputs[0], **{name.lower(): kind for name, e in extra.items() if (kind := _typed(e, inputs[0]))}}
    if isinstance(node, nodes.SelectNode):
        return _selected(node.expressions, inputs[0])
    if isinstance(node, (nodes.JoinNode, nodes.LookupJoinNode)):
        other = {key.lower() for key in node.other_keys}
        return {**inputs[0], **{name: kind for name, kind in inputs[1].items() if name not in other}}
    if isinstance(node, nodes.AggregateNode):
        keys = {key.lower(): inputs[0][key.lower()] for key in node.keys if key.lower() in inputs[0]}
        windows = dict.fromkeys((nodes.WINDOW_START, nodes.WINDOW_END), TIMESTAMP)
        calls = {call.name.lower(): kind for call in parse_aggregations(node.aggregations)
                 if (kind := _typed(call.expression, inputs[0]))}  # fmt: skip
        return {**keys, **(windows if isinstance(node, nodes.WindowAggregateNode) else {}), **calls}
    if isinstance(node, nodes.OverNode):
        calls = {call.name.lower(): kind for call in parse_aggregations(node.aggregations)
                 if (kind := _typed(call.expression, inputs[0]))}  # fmt: skip
        return {**inputs[0], **calls}
    if isinstance(node, nodes.RankNode):
        windows = dict.fromkeys((nodes.WINDOW_START, nodes.WINDOW_END), TIMESTAMP)
        ranked = {node.rank_column.lower(): exp.DataType.build("BIGINT")} if node.rank_column else {}
        return {**inputs[0], **(windows if isinstance(node, nodes.WindowTableRankNode) else {}), **ranked}
    return {}


def _selected(expressions: tuple[str, ...], upstream: Types) -> Types:
    types: Types = {}
    for expression in expressions:
        tree = parse_expression(expression)
        if isinstance(tree, exp.Star):
            types.update(upstream)
        elif isinstance(tree, exp.Alias):
            kind = infer(tree.this, upstream, spark=True)
            if kind is not None:
                types[tree.alias.lower()] = kind
        elif isinstance(tree, exp.Column) and tree.name.lower() in upstream:
            types[tree.name.lower()] = upstream[tree.name.lower()]
    return types


def over_argument_refusal(calls: Mapping[str, str], types: Types) -> str | None:
    """Why an OVER aggregate cannot take its argument, where its type is known before Spark
    starts (the workers check the same once Spark tells the types): SUM and AVG take numbers,
    MIN and MAX numbers, times and dates."""
    for text in calls.values():
        call = parse_expression(text)
        if not isinstance(call, (exp.Sum, exp.Avg, exp.Min, exp.Max)):
            continue
        kind = infer(call.this, types, spark=True)
        ordered = isinstance(call, (exp.Min, exp.Max)) and kind is not None and kind.is_type(*TIMES)
        if kind is not None and not (_numeric(kind) or ordered):
            return (f"{text} reads a {kind.sql(dialect=DIALECT)} value; an OVER aggregation sums and averages "
                    "integers and floating point numbers, and takes MIN/MAX of those and of times and dates "
                    "(CAST a DECIMAL to DOUBLE)")  # fmt: skip
    return None


def _physical_types(table: CreateTable) -> Types:
    return {column.name.lower(): kind for column in table.columns if (kind := declared(column.type))}


def _typed(expression: str, types: Types) -> exp.DataType | None:
    """An operator's expression (Spark SQL, evaluated by Spark) typed by Spark's rules."""
    tree = parse_expression(expression)
    return infer(tree, types, spark=True) if tree is not None else None


def _string(kind: exp.DataType | None) -> bool:
    return kind is not None and kind.this in exp.DataType.TEXT_TYPES


def _integer(kind: exp.DataType | None) -> TypeGuard[exp.DataType]:
    return kind is not None and kind.this in INTEGERS


def _float(kind: exp.DataType | None) -> bool:
    return kind is not None and kind.this in FLOATS


def _numeric(kind: exp.DataType | None) -> bool:
    return _integer(kind) or _float(kind)


def _wider(left: exp.DataType, right: exp.DataType) -> exp.DataType:
    return left if INTEGERS.index(left.this) >= INTEGERS.index(right.this) else right
