"""Keyed aggregates across micro-batches: Spark aggregates each batch, state merges the partials.

Only aggregates whose partial results merge exactly are accepted (count, sum, min, max,
avg); the plan recognises them (``keyflow.plan.aggregates``) before Spark starts.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.plan.aggregates import AggregateCall
from keyflow.plan.descriptors import StateDescriptor, ValueState
from keyflow.runtime.changelog import Retracting, sum_type
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.state.keyed import KeyedBatch, KeyedState


def partials(call: AggregateCall) -> dict[str, tuple[str, str]]:
    """Partial column → (merge rule, Spark expression evaluated on each micro-batch)."""
    if call.function in ("avg", "mean"):
        return {
            f"__{call.name}_sum": ("sum", f"sum(cast({call.argument} as double))"),
            f"__{call.name}_count": ("count", f"count({call.argument})"),
        }
    return {f"__{call.name}": (call.function, call.expression)}


class PartialMerge(KeyedFunction):
    """The ``process`` function of a streaming aggregate: one row per key per micro-batch
    (Spark's aggregate of the batch), merged into the running partials kept as state."""

    def __init__(self, aggregates: tuple[AggregateCall, ...], key_names: tuple[str, ...]) -> None:
        self.aggregates, self.key_names = aggregates, key_names

    def process(self, batch: KeyedBatch, state: KeyedState) -> pa.Table:
        merged = merge_partials(self.aggregates, batch, state)
        columns = {name: batch.keys.column(name) for name in self.key_names}
        return pa.table({**columns, **final_values(self.aggregates, merged)})


def merge_partials(aggregates: tuple[AggregateCall, ...], batch: KeyedBatch, state: KeyedState) -> dict[str, pa.Array]:
    """Each partial column of the batch (one row per key) merged into the keys' state."""
    merged = {}
    for aggregate in aggregates:
        for column, (rule, _) in partials(aggregate).items():
            current, new = state[column].get(), batch.data.column(column).combine_chunks()
            merged[column] = _merge(rule, current, new)
            state[column].update(merged[column])
    return merged


def final_values(aggregates: tuple[AggregateCall, ...], merged: dict[str, pa.Array]) -> dict[str, pa.Array]:
    """Each aggregate's value from its partial columns (an avg of no values is null)."""
    columns = {}
    for aggregate in aggregates:
        if aggregate.function in ("avg", "mean"):
            total, count = merged[f"__{aggregate.name}_sum"], merged[f"__{aggregate.name}_count"]
            average = pc.divide(total, pc.cast(count, pa.float64()))
            columns[aggregate.name] = pc.if_else(pc.equal(count, 0), pa.scalar(None, pa.float64()), average)
        else:
            columns[aggregate.name] = merged[f"__{aggregate.name}"]
    return columns


class RunningAggregate(KeyedFunction):
    """The process function of an aggregate that runs in the worker (after
    ``reinterpret_as_keyed``, where a Spark groupBy would shuffle again): each call reduces its
    rows per key with Arrow's hash aggregation and merges the results into running state with
    :class:`PartialMerge`'s rules, so rows need no sort; :meth:`finish` emits every key the
    subtask touched, once, as key_by's aggregate does. Takes count, sum, avg, min and max."""

    finishes = True

    def __init__(self, keys: tuple[str, ...], aggregates: tuple[Retracting, ...]) -> None:
        self.keys, self.aggregates = keys, aggregates

    @staticmethod
    def state(aggregates: tuple[Retracting, ...], types: pa.Schema) -> dict[str, StateDescriptor]:
        """The running partials of each aggregate; ``types`` holds each argument's column."""
        state: dict[str, StateDescriptor] = {}
        for a in aggregates:
            argument = None if a.argument is None else types.field(a.argument).type
            if a.function in ("min", "max"):
                state[f"__{a.name}_{a.function}"] = ValueState(argument)
            elif a.function in ("sum", "avg"):
                assert argument is not None
                total = pa.float64() if a.function == "avg" else sum_type(argument)
                state.update({f"__{a.name}_sum": ValueState(total), f"__{a.name}_count": ValueState(pa.int64())})
            else:
                state[f"__{a.name}_count"] = ValueState(pa.int64())
        return state

    def process(self, batch: KeyedBatch, state: KeyedState) -> None:
        reduced = self._reduce(batch)
        for column, (rule, values) in reduced.items():
            state[column].update(_merge(rule, state[column].get(), values))

    def _reduce(self, batch: KeyedBatch) -> dict[str, tuple[str, pa.Array]]:
        """Each state column's partial per key of the batch, with the rule that merges it.
        Arrow's column names are positional (``a0``, ``a0_float``...), so no name can clash."""
        table, wanted = pa.table({"__key": batch.key_index}), []
        for i, a in enumerate(self.aggregates):
            if a.argument is None:
                continue
            values = batch.data.column(a.argument)
            if a.function == "avg":
                values = values.cast(pa.float64())
            elif a.function == "sum" and pa.types.is_integer(values.type):
                table = table.append_column(f"a{i}_float", values.cast(pa.float64(), safe=False))
                wanted.append((f"a{i}_float", "sum"))  # to catch an overflow of the exact sum
                values = values.cast(pa.int64())
            table = table.append_column(f"a{i}", values)
            if a.function in ("sum", "avg"):
                wanted += [(f"a{i}", "sum"), (f"a{i}", "count")]
            else:
                wanted.append((f"a{i}", "count" if a.function == "count" else a.function))
            if a.function == "max" and pa.types.is_floating(values.type):  # Spark: NaN is the maximum
                table = table.append_column(f"a{i}_nan", pc.is_nan(values))
                wanted.append((f"a{i}_nan", "any"))
        grouped = table.group_by("__key", use_threads=False).aggregate(wanted)
        inverse = np.empty(batch.num_keys, dtype=np.int64)  # each key's row in ``grouped``
        inverse[grouped.column("__key").to_numpy()] = np.arange(grouped.num_rows)

        def column(name: str) -> pa.Array:
            return grouped.column(name).combine_chunks().take(pa.array(inverse))

        partials: dict[str, tuple[str, pa.Array]] = {}
        for i, a in enumerate(self.aggregates):
            prefix = f"__{a.name}"
            if a.argument is None:
                partials[f"{prefix}_count"] = ("count", pa.array(batch.counts, pa.int64()))
            elif a.function == "count":
                partials[f"{prefix}_count"] = ("count", column(f"a{i}_count"))
            elif a.function in ("sum", "avg"):
                total = column(f"a{i}_sum")
                if f"a{i}_float_sum" in grouped.column_names:
                    _check_overflow(column(f"a{i}_float_sum"), a.name)
                partials[f"{prefix}_sum"] = ("sum", total)
                partials[f"{prefix}_count"] = ("count", column(f"a{i}_count"))
            else:
                extreme = column(f"a{i}_{a.function}")
                if f"a{i}_nan_any" in grouped.column_names:
                    extreme = pc.if_else(column(f"a{i}_nan_any"), pa.scalar(float("nan"), extreme.type), extreme)
                partials[f"{prefix}_{a.function}"] = (a.function, extreme)
        return partials

    def finish(self, keys: pa.Table, state: KeyedState) -> pa.Table:
        """Every touched key with its aggregates now (an avg of no values is null)."""
        table = keys
        for a in self.aggregates:
            prefix = f"__{a.name}"
            if a.function in ("min", "max"):
                value = state[f"{prefix}_{a.function}"].get()
            elif a.function == "count":
                value = state[f"{prefix}_count"].get().fill_null(0)
            elif a.function == "sum":
                value = state[f"{prefix}_sum"].get()
            else:
                total, count = state[f"{prefix}_sum"].get(), state[f"{prefix}_count"].get().fill_null(0)
                average = pc.divide(total, pc.cast(count, pa.float64()))
                value = pc.if_else(pc.equal(count, 0), pa.scalar(None, pa.float64()), average)
            table = table.append_column(a.name, value)
        return table


def _check_overflow(approximate: pa.Array, name: str) -> None:
    """An integer sum beyond 64 bits fails, as Spark's does (with ANSI SQL, its default)."""
    limit = float(2**63)
    if len(approximate) and pc.max(pc.abs(approximate.fill_null(0))).as_py() >= limit:
        raise ArithmeticError(f"sum {name!r} overflows a 64-bit integer (as in Spark with spark.sql.ansi.enabled)")


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
