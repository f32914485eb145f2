"""The keyed functions of changelogs, run in Spark's Python workers over Arrow batches.

``Normalize`` is Flink's ChangelogNormalize: the previous row of each primary key is keyed
state, so an upsert or delete becomes a consistent changelog. ``RetractingAggregate``
aggregates a changelog: a retraction (``-U``/``-D``) subtracts what its row added. Both
compact what one call sees: per key, one retraction of the old result and one new result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.changelog import DELETE, DELETED, INSERT, OP, UPDATE_AFTER, UPDATE_BEFORE
from keyflow.plan.descriptors import MapState, StateDescriptor, ValueState
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.state.keyed import KeyedBatch, KeyedState

SIGN = "__sign"  # +1 for a row that adds, -1 for a retraction
EXISTS = "__row_exists"
ROWS = "__rows"


def _row_state(column: str) -> str:
    return f"__row_{column}"


class Normalize(KeyedFunction):
    """The process function of a NormalizeNode; it receives whole keys sorted by their source offset,
    so the last row of a key is its newest version."""

    def __init__(self, keys: tuple[str, ...], values: tuple[str, ...]) -> None:
        self.keys, self.values = keys, values

    @staticmethod
    def state(schema: pa.Schema, keys: tuple[str, ...]) -> dict[str, StateDescriptor]:
        values = [field for field in schema if field.name not in keys]
        return {EXISTS: ValueState(pa.bool_()), **{_row_state(f.name): ValueState(f.type) for f in values}}

    def process(self, batch: KeyedBatch, state: KeyedState) -> pa.Table:
        newest = batch.data.take(pa.array(batch.starts + batch.counts - 1))
        deleted = newest.column(DELETED).to_numpy(zero_copy_only=False).astype(bool)
        existed = state[EXISTS].get().fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
        previous = {name: state[_row_state(name)].get() for name in self.values}
        current = {name: newest.column(name) for name in self.values}
        unchanged = existed & ~deleted & _equal_rows(previous, current, batch.num_keys)
        retract, add = existed & ~unchanged, ~deleted & ~unchanged
        old = _with_op(batch.keys, previous, retract, np.where(deleted, DELETE, UPDATE_BEFORE))
        new = _with_op(batch.keys, current, add, np.where(existed, UPDATE_AFTER, INSERT))
        state[EXISTS].update(pa.array(np.ones(len(deleted), dtype=bool), mask=deleted))  # a deleted key: no state
        for name in self.values:
            kept = pc.if_else(pa.array(deleted), pa.nulls(len(deleted), previous[name].type), newest.column(name))
            state[_row_state(name)].update(kept)
        return pa.concat_tables([old, new])


@dataclass(frozen=True)
class Retracting:
    """One aggregate over a changelog: ``function`` of ``argument`` (None: ``count(*)``), a
    Spark expression when parsed, the column holding its values in the worker."""

    name: str
    function: str  # count, sum, avg, min, max, count_distinct
    argument: str | None

    def state(self, argument_type: pa.DataType | None) -> dict[str, StateDescriptor]:
        if self.function in ("min", "max", "count_distinct"):
            assert argument_type is not None
            return {f"__{self.name}_values": MapState(argument_type, pa.int64())}
        if self.function in ("sum", "avg"):
            assert argument_type is not None
            total = pa.float64() if self.function == "avg" else sum_type(argument_type)
            return {f"__{self.name}_sum": ValueState(total), f"__{self.name}_count": ValueState(pa.int64())}
        return {f"__{self.name}_count": ValueState(pa.int64())}

    def output_type(self, argument_type: pa.DataType | None) -> pa.DataType:
        if self.function in ("count", "count_distinct"):
            return pa.int64()
        if self.function == "avg":
            return pa.float64()
        assert argument_type is not None
        return sum_type(argument_type) if self.function == "sum" else argument_type


def sum_type(argument: pa.DataType) -> pa.DataType:
    """Spark's result type of ``sum``: bigint for integers, double for floating point."""
    return pa.int64() if pa.types.is_integer(argument) else pa.float64()


class RetractingAggregate(KeyedFunction):
    """The process function of a changelog aggregate: rows carry ``SIGN`` and the arguments."""

    def __init__(self, keys: tuple[str, ...], aggregates: tuple[Retracting, ...], every_key: bool = False) -> None:
        """``every_key``: emit every key of the batch, changed or not (the upsert output of
        ``key_by(...).aggregate``), instead of only changed results (a changelog)."""
        self.keys, self.aggregates, self.every_key = keys, aggregates, every_key

    def process(self, batch: KeyedBatch, state: KeyedState) -> pa.Table:
        keys, sign = batch.key_index, batch.data.column(SIGN).to_numpy(zero_copy_only=False).astype(np.int64)
        rows_before = state[ROWS].get().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        rows_after = rows_before + np.bincount(keys, weights=sign, minlength=batch.num_keys).astype(np.int64)
        existed, exists = rows_before > 0, rows_after > 0
        before: dict[str, pa.Array] = {}
        after: dict[str, pa.Array] = {}
        for aggregate in self.aggregates:
            before[aggregate.name], after[aggregate.name] = self._update(aggregate, batch, state, sign, ~exists)
        changed = np.ones(batch.num_keys, dtype=bool) if self.every_key else ~_equal_rows(before, after, batch.num_keys)
        retract, add = existed & (~exists | changed), exists & (~existed | changed)
        old = _with_op(batch.keys, before, retract, np.where(exists, UPDATE_BEFORE, DELETE))
        new = _with_op(batch.keys, after, add, np.where(existed, UPDATE_AFTER, INSERT))
        # A group whose rows are all retracted is cleared, as Flink's GroupAggFunction does; a net
        # retraction on an empty group is ignored (it retracts rows this operator never added).
        state[ROWS].update(pa.array(rows_after, pa.int64(), mask=~exists))
        return pa.concat_tables([old, new])

    def _update(
        self,
        aggregate: Retracting,
        batch: KeyedBatch,
        state: KeyedState,
        sign: npt.NDArray[np.int64],
        cleared: npt.NDArray[np.bool_],
    ) -> tuple[pa.Array, pa.Array]:
        """The aggregate's value per key before and after this batch; its state is updated
        (and emptied for ``cleared`` keys)."""
        prefix, count = f"__{aggregate.name}", batch.num_keys
        if aggregate.argument is None:
            values, valid = None, np.ones(len(sign), dtype=bool)
        else:
            values = batch.data.column(aggregate.argument).combine_chunks()
            valid = values.is_valid().to_numpy(zero_copy_only=False).astype(bool)
        if aggregate.function in ("min", "max", "count_distinct"):
            assert values is not None
            entries = state[f"{prefix}_values"]
            old = entries.get()
            new = _merge_counts(old, batch.key_index[valid], values.filter(pa.array(valid)), sign[valid], count)
            entries.update(pc.if_else(pa.array(cleared), pa.nulls(count, new.type), new))
            return _reduce(old, aggregate.function), _reduce(new, aggregate.function)
        counts = state[f"{prefix}_count"]
        count_before = counts.get().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        count_after = count_before + np.bincount(batch.key_index, weights=sign * valid, minlength=count).astype(
            np.int64
        )
        counts.update(pa.array(count_after, pa.int64(), mask=cleared))
        if aggregate.function == "count":
            return pa.array(count_before), pa.array(count_after)
        assert values is not None
        sums = state[f"{prefix}_sum"]
        total_type = sums.get().type
        signed = pc.multiply(pc.fill_null(values.cast(total_type), 0), pa.array(sign).cast(total_type))
        added = pa.table({"key": batch.key_index, "value": signed}).group_by("key").aggregate([("value", "sum")])
        delta = np.zeros(count, dtype=total_type.to_pandas_dtype())
        delta[added.column("key").to_numpy()] = added.column("value_sum").to_numpy(zero_copy_only=False)
        sum_before = sums.get().fill_null(0).to_numpy(zero_copy_only=False)
        sum_after = pc.add_checked(pa.array(sum_before), pa.array(delta)).to_numpy(
            zero_copy_only=False
        )  # as Spark: overflow fails
        sums.update(pa.array(sum_after, total_type, mask=cleared))
        if aggregate.function == "sum":
            return _nulls_where(sum_before, count_before, total_type), _nulls_where(sum_after, count_after, total_type)
        return (
            _nulls_where(sum_before / np.maximum(count_before, 1), count_before, pa.float64()),
            _nulls_where(sum_after / np.maximum(count_after, 1), count_after, pa.float64()),
        )


def _nulls_where(values: npt.NDArray[Any], counts: npt.NDArray[np.int64], kind: pa.DataType) -> pa.Array:
    """``values`` with a null where no non-null argument is left (SQL: the sum of nothing is null)."""
    return pa.array(values, kind, mask=counts <= 0)


def _merge_counts(
    current: pa.Array, key_index: npt.NDArray[np.int64], values: pa.Array, sign: npt.NDArray[np.int64], keys: int
) -> pa.MapArray:
    """Each key's multiset of values (value -> how many rows hold it) with this batch's rows
    added or retracted; values no row holds any more are dropped."""
    lengths, entries = _entries(current)
    stored = pa.table(
        {
            "key": np.repeat(np.arange(keys, dtype=np.int64), lengths),
            "value": entries.field("key"),
            "count": entries.field("value"),
        }
    )
    changes = pa.table({"key": key_index.astype(np.int64), "value": values, "count": sign})
    merged = pa.concat_tables([stored, changes]).group_by(["key", "value"]).aggregate([("count", "sum")])
    merged = merged.filter(pc.greater(merged.column("count_sum"), 0)).sort_by([("key", "ascending")])
    offsets = np.searchsorted(merged.column("key").to_numpy(), np.arange(keys + 1)).astype(np.int32)
    return pa.MapArray.from_arrays(
        pa.array(offsets), merged.column("value").combine_chunks(), merged.column("count_sum").combine_chunks()
    ).cast(current.type)


def _entries(multisets: pa.Array) -> tuple[npt.NDArray[np.int64], pa.StructArray]:
    """Each key's number of entries (0 for none) and all entries, key by key."""
    offsets = multisets.offsets.to_numpy().astype(np.int64)  # into .values, also when sliced
    valid = multisets.is_valid().to_numpy(zero_copy_only=False).astype(bool)
    lengths = np.where(valid, np.diff(offsets), 0)
    before = np.cumsum(lengths) - lengths
    positions = np.repeat(offsets[:-1] - before, lengths) + np.arange(int(lengths.sum()))
    return lengths, multisets.values.take(pa.array(positions, pa.int64()))


def _reduce(multisets: pa.Array, function: str) -> pa.Array:
    """Per key: the smallest or largest value held, or the number of distinct values."""
    lengths, entries = _entries(multisets)
    if function == "count_distinct":
        return pa.array(lengths, pa.int64())
    values, keys = entries.field("key"), len(lengths)
    if len(values) == 0:
        return pa.nulls(keys, values.type)
    owners = np.repeat(np.arange(keys, dtype=np.int64), lengths)
    table = pa.table({"key": owners, "value": values})
    wanted = [("value", function)]
    nan = function == "max" and pa.types.is_floating(values.type)
    if nan:  # Spark orders NaN above every number (Arrow skips it): a held NaN is the maximum
        table, wanted = table.append_column("nan", pc.is_nan(values)), [*wanted, ("nan", "any")]
    reduced = table.group_by("key").aggregate(wanted)
    position = np.full(keys, -1, dtype=np.int64)
    position[reduced.column("key").to_numpy()] = np.arange(reduced.num_rows)
    picked = reduced.column(f"value_{function}").combine_chunks()
    if nan:
        nan_held = reduced.column("nan_any").combine_chunks()
        picked = pc.if_else(nan_held, pa.scalar(float("nan"), values.type), picked)
    picked = picked.take(pa.array(np.maximum(position, 0)))
    return pc.if_else(pa.array(position >= 0), picked, pa.nulls(keys, values.type))


def _equal_rows(left: dict[str, Any], right: dict[str, Any], rows: int) -> npt.NDArray[np.bool_]:
    """Per row: every column equal (two nulls are equal)."""
    equal = np.ones(rows, dtype=bool)
    for name, values in left.items():
        other = right[name]
        same = pc.fill_null(pc.equal(values, other), False)
        both_null = pc.and_(pc.is_null(values), pc.is_null(other))
        equal &= pc.or_(same, both_null).to_numpy(zero_copy_only=False).astype(bool)
    return equal


def _with_op(keys: pa.Table, values: dict[str, Any], chosen: npt.NDArray[np.bool_], ops: npt.NDArray[Any]) -> pa.Table:
    """The rows of ``chosen`` keys: key columns, ``values`` and their row kind."""
    table = keys
    for name, column in values.items():
        table = table.append_column(name, column)
    table = table.append_column(OP, pa.array(ops, pa.string()))
    return table.filter(pa.array(chosen))
