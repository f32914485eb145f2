"""Flink's meaning for functions Spark also has under the same name, as Spark SQL.

A script is Flink SQL, so where the two engines disagree keyflow rewrites the call before
handing it to Spark (docs/sql.md lists each difference). Pure: sqlglot trees in and out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sqlglot import exp

from keyflow.sql import date_formats, strings
from keyflow.sql.dialect import Flink
from keyflow.sql.errors import SqlError, position
from keyflow.sql.templates import call


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
        return _BY_NAME.get(node.name.upper()) or strings.BY_NAME.get(node.name.upper())
    if type(node) in strings.BY_CLASS:
        return strings.BY_CLASS[type(node)]
    if isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc):
        return lambda filtered: _filtered(filtered.this, filtered.expression.this)
    return None


def _regexp_extract(node: exp.RegexpExtract) -> exp.Expr:
    """Flink: NULL where the pattern does not match (Spark: ``''``), and NULL for a group the
    pattern does not have (Spark fails the job), where both are literals."""
    text, pattern, group = node.this, node.expression, node.args.get("group")
    if _missing_group(pattern, group):
        return exp.Cast(this=exp.Null(), to=exp.DataType.build("STRING"))
    return exp.Case(ifs=[exp.If(this=exp.RegexpLike(this=text.copy(), expression=pattern.copy()), true=node)])


def _missing_group(pattern: exp.Expr, group: exp.Expr | None) -> bool:
    """Whether a literal ``group`` index is outside a literal ``pattern``'s groups (counted by
    Python's ``re``, which reads Java's group syntax alike; a pattern it cannot read: unknown)."""
    negative = isinstance(group, exp.Neg)
    index = group.this if isinstance(group, exp.Neg) else group
    if not (isinstance(pattern, exp.Literal) and pattern.is_string and isinstance(index, exp.Literal)):
        return False
    if not index.name.isdigit():
        return False  # not a whole number: Spark's error stands
    try:
        groups = re.compile(pattern.name).groups
    except re.error:
        return False
    return negative or int(index.name) > groups


def _date_format(node: exp.Anonymous) -> exp.Expr:
    """Flink's ``DATE_FORMAT(ts, pattern)`` (``keyflow.sql.date_formats``); a pattern that is
    not a literal is Spark's."""
    return _formatted(node, string=False)


def _string_date_format(node: exp.Anonymous) -> exp.Expr:
    """``DATE_FORMAT`` of a STRING (marked so by :func:`mark_string_date_format`)."""
    return _formatted(node, string=True)


def _formatted(node: exp.Anonymous, string: bool) -> exp.Expr:
    value, pattern = strings.arguments(node, (2,), "DATE_FORMAT(timestamp_or_string, 'pattern')")
    string = string or (isinstance(value, exp.Literal) and value.is_string)
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        return call("date_format", value, pattern)
    try:
        if string:
            return date_formats.formatted(
                date_formats.string_timestamp(value), date_formats.string_pattern(pattern.name)
            )
        return date_formats.formatted(value, date_formats.timestamp_pattern(pattern.name))
    except ValueError as error:
        raise SqlError(f"DATE_FORMAT pattern {pattern.sql(dialect=Flink)} at {position(node)}: {error}") from None


def mark_string_date_format(node: exp.Expr) -> None:
    """Mark a ``DATE_FORMAT`` call whose first argument is a STRING (a typed pass knows it)."""
    if isinstance(node, exp.Anonymous) and node.name.upper() == "DATE_FORMAT":
        node.set("this", _STRING_DATE_FORMAT)


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
    return call("timestamp_seconds" if precision.name == "0" else "timestamp_millis", epoch)


_STRING_DATE_FORMAT = "__KEYFLOW_DATE_FORMAT_OF_STRING"
_BY_NAME: dict[str, Callable[[Any], exp.Expr]] = {
    "PROCTIME": lambda node: call("current_timestamp"),  # a micro-batch's processing time
    "TO_TIMESTAMP_LTZ": _to_timestamp_ltz,
    "DATE_FORMAT": _date_format,
    _STRING_DATE_FORMAT: _string_date_format,
}


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
