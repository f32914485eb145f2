"""Keyed aggregates across micro-batches: Spark aggregates each batch, state merges the partials.

Only aggregates whose partial results merge exactly are accepted (count, sum, min, max,
avg); each is recognised with Spark's own SQL parser, so any argument expression works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from keyflow.errors import PlanError
from keyflow.runtime.changelog import Retracting

MERGEABLE = ("count", "sum", "min", "max", "avg", "mean")


@dataclass(frozen=True)
class Aggregate:
    """One output column: ``function(argument)``; ``expression`` is the user's text."""

    name: str
    function: str
    expression: str

    def partials(self) -> dict[str, tuple[str, str]]:
        """Partial column → (merge rule, Spark expression evaluated on each micro-batch)."""
        if self.function in ("avg", "mean"):
            argument = self.expression[self.expression.index("(") + 1 : self.expression.rindex(")")]
            return {
                f"__{self.name}_sum": ("sum", f"sum(cast({argument} as double))"),
                f"__{self.name}_count": ("count", f"count({argument})"),
            }
        return {f"__{self.name}": (self.function, self.expression)}


def mergeable_aggregates(spark: SparkSession, operator: str, aggregations: dict[str, str]) -> list[Aggregate]:
    """Each ``name='expression'`` as an :class:`Aggregate`, or a PlanError naming the one that
    cannot be merged across micro-batches (parsed once per operator, not per micro-batch)."""
    key = (operator, tuple(aggregations.items()))
    if key not in _PARSED:
        _PARSED[key] = _parse(spark, operator, aggregations)
    return list(_PARSED[key])


_PARSED: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Aggregate, ...]] = {}


def _parse(spark: SparkSession, operator: str, aggregations: dict[str, str]) -> tuple[Aggregate, ...]:
    parser = spark._jsparkSession.sessionState().sqlParser()  # type: ignore[union-attr]
    parsed = []
    for name, expression in aggregations.items():
        tree = parser.parseExpression(expression)
        function = ""
        if tree.getClass().getSimpleName() == "UnresolvedFunction" and not tree.isDistinct():
            function = str(tree.nameParts().last()).lower()
            if function in ("avg", "mean") and tree.filter().isDefined():
                function = ""
        if function not in MERGEABLE:
            raise PlanError(
                f"operator {operator!r}: aggregate {name}={expression!r} cannot be kept as running state across "
                f"micro-batches; a streaming aggregate supports {', '.join(MERGEABLE)} (not DISTINCT); "
                "use process(...) with state for anything else"
            )
        parsed.append(Aggregate(name, function, expression.strip()))
    return tuple(parsed)


RETRACTABLE = ("count", "sum", "avg", "min", "max", "count(distinct)")


def retracting_aggregates(
    spark: SparkSession, operator: str, aggregations: dict[str, str], where: str = "over a changelog"
) -> list[Retracting]:
    """Each ``name='function(argument)'`` of an aggregate over a changelog, or a PlanError
    naming the one that cannot retract a row; ``argument`` is the Spark expression."""
    parser = spark._jsparkSession.sessionState().sqlParser()  # type: ignore[union-attr]
    found = []
    for name, expression in aggregations.items():
        tree = parser.parseExpression(expression)
        function = ""
        if tree.getClass().getSimpleName() == "UnresolvedFunction" and not tree.filter().isDefined():
            function = str(tree.nameParts().last()).lower()
            arguments = tree.arguments()
            if function == "mean":
                function = "avg"
            if tree.isDistinct():
                function = "count_distinct" if function == "count" else ""
            if arguments.size() != 1:
                function = ""
        if function not in ("count", "sum", "avg", "min", "max", "count_distinct"):
            raise PlanError(
                f"operator {operator!r}: aggregate {name}={expression!r} is not supported {where}; an aggregate "
                f"{where.split(' (')[0]} supports {', '.join(RETRACTABLE)} of one argument"
            )
        argument = arguments.apply(0)
        star = argument.getClass().getSimpleName() in ("UnresolvedStar", "Literal") and function == "count"
        found.append(Retracting(name, function, None if star else str(argument.sql())))
    return found


class PartialMerge:
    """The ``process`` function of a streaming aggregate: one row per key per micro-batch
    (Spark's aggregate of the batch), merged into the running partials kept as state."""

    def __init__(self, aggregates: list[Aggregate], key_names: tuple[str, ...]) -> None:
        self.aggregates, self.key_names = aggregates, key_names

    def __call__(self, batch: Any, state: Any) -> pa.Table:
        columns = {name: batch.keys.column(name) for name in self.key_names}
        for aggregate in self.aggregates:
            merged = {}
            for column, (rule, _) in aggregate.partials().items():
                current, new = state[column].get(), batch.data.column(column).combine_chunks()
                merged[column] = _merge(rule, current, new)
                state[column].update(merged[column])
            if aggregate.function in ("avg", "mean"):
                total, count = merged[f"__{aggregate.name}_sum"], merged[f"__{aggregate.name}_count"]
                average = pc.divide(total, pc.cast(count, pa.float64()))
                columns[aggregate.name] = pc.if_else(pc.equal(count, 0), pa.scalar(None, pa.float64()), average)
            else:
                columns[aggregate.name] = merged[f"__{aggregate.name}"]
        return pa.table(columns)


def _merge(rule: str, current: pa.Array, new: pa.Array) -> pa.Array:
    if rule == "count":
        return pc.add(current.fill_null(0), new)
    if rule == "sum":
        return pc.coalesce(pc.add_checked(current, new), current, new)
    if pa.types.is_floating(current.type):
        # Spark orders NaN above every number: max keeps a NaN, min drops it unless all are NaN.
        if rule == "min":
            return pc.min_element_wise(current, new)
        nan = pc.fill_null(pc.or_(pc.is_nan(current), pc.is_nan(new)), False)
        return pc.if_else(nan, pa.scalar(float("nan"), current.type), pc.max_element_wise(current, new))
    # Any comparable type (timestamps, dates, strings, booleans): compare, nulls skipped.
    better = pc.less(new, current) if rule == "min" else pc.greater(new, current)
    return pc.coalesce(pc.if_else(pc.fill_null(better, False), new, current), current, new)
