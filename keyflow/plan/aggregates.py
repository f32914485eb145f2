"""Aggregate expressions understood when the plan is built, with sqlglot: no Spark needed.

A keyed aggregate that keeps state across micro-batches must know what each ``name='expr'``
computes (which function, of which argument) to merge or retract it; finding that out here
means an unsupported aggregate is a plan error before any SparkSession exists, not a failure
in micro-batch 0. Arguments are handed to Spark as Spark SQL text.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.tokenizer_core import TokenType

from keyflow.errors import PlanError

MERGEABLE = ("count", "sum", "min", "max", "avg", "mean")
RETRACTABLE = ("count", "sum", "avg", "min", "max", "count(distinct)")


@dataclass(frozen=True)
class AggregateCall:
    """``name = function(arguments)`` as written; ``function`` is empty when the expression is
    not one plain aggregate call (``sum(x) + 1``)."""

    name: str
    expression: str
    function: str
    arguments: tuple[str, ...]  # Spark SQL text of each argument; () for count(*)
    distinct: bool
    filtered: bool
    columns: frozenset[str]  # the input columns it reads
    rows: bool = False  # count(*) or count(1): counts rows
    parsed: bool = True  # False: not SQL sqlglot reads (Spark may: a batch aggregate passes it on)

    @property
    def argument(self) -> str | None:
        """The one argument (None: ``count(*)``/``count(1)``, which count rows)."""
        return self.arguments[0] if self.arguments else None


def parse_aggregations(aggregations: Mapping[str, str]) -> tuple[AggregateCall, ...]:
    """Each aggregation as far as sqlglot reads it (``parsed`` False where it cannot)."""
    return _parsed(tuple(aggregations.items()))


@functools.lru_cache(maxsize=1024)
def _parsed(aggregations: tuple[tuple[str, str], ...]) -> tuple[AggregateCall, ...]:
    """Parsed once per distinct aggregations: the plan checks and the physical kind both read them."""
    calls = []
    for name, expression in aggregations:
        tree = parse_expression(expression)
        if tree is None:
            calls.append(AggregateCall(name, expression.strip(), "", (), False, False, frozenset(), parsed=False))
        else:
            calls.append(_call(name, expression.strip(), tree))
    return tuple(calls)


@functools.lru_cache(maxsize=4096)
def parse_expression(expression: str) -> exp.Expr | None:
    """``expression`` as sqlglot reads Spark SQL, parsed once per text (the trees are only
    read); None where it cannot (Spark's dialect is larger: Spark then checks it)."""
    try:
        return sqlglot.parse_one(expression, read="spark")
    except sqlglot.errors.SqlglotError:
        return None


def _unreadable(operator: str, call: AggregateCall, why: str) -> str:
    return (
        f"operator {operator!r}: aggregate {call.name}={call.expression!r} is not a SQL expression keyflow can read "
        f"({why}); write it as in Spark SQL, e.g. sum(amount)"
    )


def mergeable(operator: str, calls: tuple[AggregateCall, ...]) -> tuple[AggregateCall, ...]:
    """The calls of a streaming aggregate, whose per-batch partials merge exactly into state."""
    problems = [
        _unreadable(operator, call, "needed to keep it as running state")
        if not call.parsed
        else f"operator {operator!r}: aggregate {call.name}={call.expression!r} cannot be kept as running state "
        f"across micro-batches; a streaming aggregate supports {', '.join(MERGEABLE)} (not DISTINCT); use "
        "process(...) with state for anything else"
        for call in calls
        if call.function not in MERGEABLE or call.distinct or (call.function in ("avg", "mean") and call.filtered)
    ]
    if problems:
        raise PlanError(*problems)
    return calls


def retractable(operator: str, calls: tuple[AggregateCall, ...], where: str) -> tuple[AggregateCall, ...]:
    """The calls of an aggregate that retracts rows (over a changelog, or in the worker):
    one argument each, no FILTER; ``function`` becomes count, sum, avg, min, max or count_distinct."""
    found, problems = [], []
    for call in calls:
        function = "avg" if call.function == "mean" else call.function
        if call.distinct:
            function = "count_distinct" if function == "count" else ""
        if call.filtered or len(call.arguments) > 1 or (not call.arguments and not call.rows):
            function = ""
        if not call.parsed:
            problems.append(_unreadable(operator, call, "needed to retract rows"))
        elif function not in ("count", "sum", "avg", "min", "max", "count_distinct"):
            problems.append(
                f"operator {operator!r}: aggregate {call.name}={call.expression!r} is not supported {where}; an "
                f"aggregate {where.split(' (')[0]} supports {', '.join(RETRACTABLE)} of one argument"
            )
        found.append(AggregateCall(call.name, call.expression, function, call.arguments, False, False, call.columns,
                                   call.rows))  # fmt: skip
    if problems:
        raise PlanError(*problems)
    return tuple(found)


def over_calls(operator: str, calls: tuple[AggregateCall, ...]) -> tuple[AggregateCall, ...]:
    """The calls of an OVER aggregation: count, sum, avg, min or max of one argument (no
    DISTINCT, no FILTER), as Flink's streaming OVER aggregates without retraction."""
    found = retractable(operator, calls, "in an OVER aggregation")
    distinct = [call for call in found if call.function == "count_distinct"]
    if distinct:
        raise PlanError(f"operator {operator!r}: aggregate {distinct[0].name}={distinct[0].expression!r}: "
                        "COUNT(DISTINCT …) OVER is not supported yet; count distinct values in a GROUP BY")  # fmt: skip
    return found


def _call(name: str, expression: str, tree: exp.Expr) -> AggregateCall:
    columns = read_columns(tree)
    while isinstance(tree, (exp.Paren, exp.IgnoreNulls, exp.RespectNulls)):  # as Spark's parser reads them
        tree = tree.this
    filtered = isinstance(tree, exp.Filter)
    if filtered:
        tree = tree.this
    if isinstance(tree, exp.Anonymous):
        function, arguments = tree.name.lower(), list(tree.expressions)
    elif isinstance(tree, exp.AggFunc):
        function = tree.sql_name().lower()
        arguments = [tree.this, *tree.expressions] if tree.this is not None else list(tree.expressions)
    else:
        return AggregateCall(name, expression, "", (), False, filtered, columns)
    distinct = len(arguments) == 1 and isinstance(arguments[0], exp.Distinct)
    if distinct:
        arguments = list(arguments[0].expressions)
    rows = function == "count" and len(arguments) == 1 and isinstance(arguments[0], (exp.Star, exp.Literal))
    texts = _argument_texts(expression)
    if texts is None or len(texts) != len(arguments):
        return AggregateCall(name, expression, "", (), False, filtered, columns)  # not one plain call
    return AggregateCall(name, expression, function, () if rows and not distinct else tuple(texts), distinct,
                         filtered, columns, rows and not distinct)  # fmt: skip


def _argument_texts(expression: str) -> list[str] | None:
    """The arguments of the first call in ``expression`` as the user wrote them: Spark gets
    them verbatim (sqlglot's rendering may rewrite a function Spark has and it does not know)."""
    tokens = sqlglot.tokenize(expression, read="spark")
    opens = (TokenType.L_PAREN, TokenType.L_BRACKET)
    start = next((i for i in range(1, len(tokens)) if tokens[i].token_type == TokenType.L_PAREN
                  and tokens[i - 1].token_type not in (*opens, TokenType.COMMA)), None)  # fmt: skip
    if start is None:
        return None
    arguments: list[str] = []
    depth, first = 0, start + 1
    for i in range(start, len(tokens)):
        kind = tokens[i].token_type
        if kind in opens:
            depth += 1
        elif kind in (TokenType.R_PAREN, TokenType.R_BRACKET):
            depth -= 1
        if (depth == 1 and kind == TokenType.COMMA) or depth == 0:
            if first < i:
                if tokens[first].token_type == TokenType.DISTINCT:
                    first += 1
                arguments.append(expression[tokens[first].start : tokens[i - 1].end + 1].strip())
            first = i + 1
        if depth == 0:
            return arguments
    return None


def read_columns(tree: exp.Expr) -> frozenset[str]:
    """The input columns an expression reads: ``s.field`` reads column ``s`` (a struct);
    the variables of its lambdas (``x -> x + 1``) are no columns."""
    bound = {variable.name.lower() for lam in tree.find_all(exp.Lambda) for variable in lam.expressions}
    roots = (column.parts[0].name for column in tree.find_all(exp.Column) if not column.is_star)
    return frozenset(root for root in roots if root.lower() not in bound)
