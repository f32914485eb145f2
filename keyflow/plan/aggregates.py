"""Aggregate expressions understood when the plan is built, with sqlglot: no Spark needed.

A keyed aggregate that keeps state across micro-batches must know what each ``name='expr'``
computes (which function, of which argument) to merge or retract it; finding that out here
means an unsupported aggregate is a plan error before any SparkSession exists, not a failure
in micro-batch 0. Arguments are handed to Spark as Spark SQL text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

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
    columns: frozenset[str]  # the input columns it reads (empty when it cannot tell: lambdas)

    @property
    def argument(self) -> str | None:
        """The one argument (None: ``count(*)``/``count(1)``, which count rows)."""
        return self.arguments[0] if self.arguments else None


def parse_aggregations(operator: str, aggregations: Mapping[str, str]) -> tuple[AggregateCall, ...]:
    """Each aggregation parsed, or one PlanError naming every expression that is not SQL."""
    calls, problems = [], []
    for name, expression in aggregations.items():
        try:
            tree = sqlglot.parse_one(expression, read="spark")
        except sqlglot.errors.SqlglotError as error:
            problems.append(
                f"operator {operator!r}: aggregate {name}={expression!r} is not a SQL expression "
                f"({str(error).splitlines()[0]}); write it as in Spark SQL, e.g. sum(amount)"
            )
            continue
        calls.append(_call(name, expression.strip(), tree))
    if problems:
        raise PlanError(*problems)
    return tuple(calls)


def mergeable(operator: str, calls: tuple[AggregateCall, ...]) -> tuple[AggregateCall, ...]:
    """The calls of a streaming aggregate, whose per-batch partials merge exactly into state."""
    problems = [
        f"operator {operator!r}: aggregate {call.name}={call.expression!r} cannot be kept as running state across "
        f"micro-batches; a streaming aggregate supports {', '.join(MERGEABLE)} (not DISTINCT); use process(...) "
        "with state for anything else"
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
        if call.filtered or len(call.arguments) > 1 or (not call.arguments and function != "count"):
            function = ""
        if function not in ("count", "sum", "avg", "min", "max", "count_distinct"):
            problems.append(
                f"operator {operator!r}: aggregate {call.name}={call.expression!r} is not supported {where}; an "
                f"aggregate {where.split(' (')[0]} supports {', '.join(RETRACTABLE)} of one argument"
            )
        found.append(AggregateCall(call.name, call.expression, function, call.arguments, False, False, call.columns))
    if problems:
        raise PlanError(*problems)
    return tuple(found)


def _call(name: str, expression: str, tree: exp.Expr) -> AggregateCall:
    columns = frozenset() if tree.find(exp.Lambda) else frozenset(_root_column(c) for c in tree.find_all(exp.Column))
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
    counts_rows = function == "count" and len(arguments) == 1 and isinstance(arguments[0], (exp.Star, exp.Literal))
    texts = () if counts_rows and not distinct else tuple(a.sql(dialect="spark") for a in arguments)
    return AggregateCall(name, expression, function, texts, distinct, filtered, columns)


def _root_column(column: exp.Column) -> str:
    """``s.field`` reads column ``s`` (a struct); ``x`` reads ``x``."""
    return column.parts[0].name
