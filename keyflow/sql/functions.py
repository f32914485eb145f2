"""Flink's meaning for functions Spark also has under the same name, as Spark SQL.

A script is Flink SQL, so where the two engines disagree keyflow rewrites the call before
handing it to Spark (docs/sql.md lists each difference). Pure: sqlglot trees in and out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlglot import exp

from keyflow.sql.dialect import Flink
from keyflow.sql.errors import SqlError, position


def spark_sql(expression: exp.Expr) -> str:
    """``expression`` as Spark SQL, with Flink's meanings."""
    return str(flink_meanings(expression.copy()).sql(dialect="spark"))  # Spark's string escapes


def flink_meanings(expression: exp.Expr) -> exp.Expr:
    """``expression`` rewritten so that Spark computes what Flink would."""
    return expression.transform(_rewrite)


def _rewrite(node: exp.Expr) -> exp.Expr:
    rewriter = _rewriter(node)
    if rewriter is None:
        return node
    for child in list(node.iter_expressions()):  # its arguments first: transform does not revisit new nodes
        child.replace(flink_meanings(child))
    return rewriter(node)


def _rewriter(node: exp.Expr) -> Callable[[Any], exp.Expr] | None:
    """The rewrite Flink's meaning asks of ``node``, if any."""
    if isinstance(node, exp.RegexpExtract):
        return _regexp_extract
    if isinstance(node, exp.Anonymous):
        return _BY_NAME.get(node.name.upper())
    if isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc):
        return lambda filtered: _filtered(filtered.this, filtered.expression.this)
    return None


def _regexp_extract(node: exp.RegexpExtract) -> exp.Expr:
    """Flink: NULL where the pattern does not match (Spark: ``''``)."""
    text, pattern = node.this, node.expression
    return exp.Case(ifs=[exp.If(this=exp.RegexpLike(this=text.copy(), expression=pattern.copy()), true=node)])


def _split_index(node: exp.Anonymous) -> exp.Expr:
    """Flink's ``SPLIT_INDEX(s, separator, i)``: the i-th (from 0) piece of ``s`` split at the
    literal ``separator``; NULL where there is none (Spark has no such function)."""
    text, separator, index = (argument.copy() for argument in node.expressions)
    quoted = _call("concat", exp.Literal.string("\\Q"), separator, exp.Literal.string("\\E"))
    pieces = _call("split", text, quoted, exp.Literal.number(-1))
    piece = _call("try_element_at", pieces, exp.Add(this=index.copy(), expression=exp.Literal.number(1)))
    return exp.Case(ifs=[exp.If(this=exp.GTE(this=index, expression=exp.Literal.number(0)), true=piece)])


def _to_timestamp_ltz(node: exp.Anonymous) -> exp.Expr:
    """Flink's ``TO_TIMESTAMP_LTZ(epoch, precision)``: seconds (0) or milliseconds (3, the
    default) since the epoch (Spark's function of that name parses a string)."""
    epoch, *rest = (argument.copy() for argument in node.expressions)
    if isinstance(epoch, exp.Literal) and epoch.is_string:
        return node  # a string to parse: Spark's meaning is Flink's TO_TIMESTAMP_LTZ(string[, format])
    precision = rest[0] if rest else exp.Literal.number(3)
    if not isinstance(precision, exp.Literal) or precision.name not in ("0", "3"):
        raise SqlError(
            f"TO_TIMESTAMP_LTZ(…, {precision.sql(dialect=Flink)}) at {position(node)}: keyflow takes the precision "
            "0 (seconds) or 3 (milliseconds)"
        )
    return _call("timestamp_seconds" if precision.name == "0" else "timestamp_millis", epoch)


_BY_NAME: dict[str, Callable[[Any], exp.Expr]] = {
    "PROCTIME": lambda node: _call("current_timestamp"),  # a micro-batch's processing time
    "SPLIT_INDEX": _split_index,
    "TO_TIMESTAMP_LTZ": _to_timestamp_ltz,
}


def _call(name: str, *arguments: exp.Expr) -> exp.Expr:
    """A Spark function call as written (sqlglot's own function nodes may reorder arguments)."""
    return exp.Anonymous(this=name, expressions=list(arguments))


def _filtered(call: exp.AggFunc, condition: exp.Expr) -> exp.Expr:
    """``AGG(x) FILTER (WHERE c)`` as ``AGG(CASE WHEN c THEN x END)``: aggregates skip NULLs, so
    the answer is the same, and keyflow's retracting aggregates take the plain form."""
    argument = call.this
    if isinstance(argument, exp.Distinct):
        when = [exp.Case(ifs=[exp.If(this=condition.copy(), true=inner)]) for inner in argument.expressions]
        argument.set("expressions", when)
        return call
    value = exp.Literal.number(1) if isinstance(argument, exp.Star) else argument
    call.set("this", exp.Case(ifs=[exp.If(this=condition.copy(), true=value)]))
    return call
