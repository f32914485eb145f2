"""Flink's OVER aggregation: batch on Spark's window functions, streaming in the workers.

Streaming follows Flink's ``RowTime{Rows,Range}{Unbounded,Bounded}PrecedingFunction``: a row
waits in its key's state until the watermark passes its time; then the key's due rows, in
time order (equal times in arrival order), each get the aggregates of their frame and are
emitted, insert-only. A row at or before the last time its key fired is late and dropped
(counted), as Flink drops it. Vectorised per call: every frame is a range ``[start, end)`` of
one array of *partials* (per call: the count of values, their sum, their min or max) holding
each key's kept history, then its due rows; counts and sums are differences of prefix sums,
min and max one ``reduceat``. What a key keeps for later frames: an unbounded frame's running
partials (one merged row), a ``ROWS n`` frame's last ``n`` rows, a ``RANGE`` frame's rows
its next row can still reach.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Accumulator
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from keyflow.plan.aggregates import AggregateCall
from keyflow.plan.descriptors import ListState, StateDescriptor, ValueState
from keyflow.plan.nodes import OverFrame
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.runtime.window_assign import event_micros
from keyflow.state.keyed import (
    KeyedBatch,
    KeyedState,
    ListStateView,
    ValueStateView,
    empty_if_null,
    list_lengths,
    positions_within,
)
from keyflow.state.memory import KeyedStateStore
from keyflow.state.timers import TaskTime

TIME = "__over_time"  # the row's event time in microseconds
PENDING, FIRE_AT, LAST_FIRED, HISTORY = "__over_pending", "__over_fire_at", "__over_last_fired", "__over_history"
Positions = npt.NDArray[np.int64]


def over_batch(frame: DataFrame, keys: tuple[str, ...], order: str, over: OverFrame,
               calls: tuple[AggregateCall, ...]) -> DataFrame:  # fmt: skip
    """Each row with its aggregates, by Spark's window functions over the same frame
    (RANGE by the event time in microseconds); a row without an event time is dropped, as a
    stream drops it (late, counted)."""
    ordered = event_micros(order)
    frame = frame.where(ordered.isNotNull())
    window = Window.partitionBy(*keys).orderBy(ordered)
    start = Window.unboundedPreceding if over.preceding is None else -over.preceding
    window = window.rowsBetween(start, 0) if over.rows else window.rangeBetween(start, 0)
    return frame.withColumns({call.name: _spark_call(call).over(window) for call in calls})


def _spark_call(call: AggregateCall) -> Column:
    if call.argument is None:
        return F.count(F.lit(1))
    return {"count": F.count, "sum": F.sum, "avg": F.avg, "min": F.min, "max": F.max}[call.function](
        F.expr(call.argument))  # fmt: skip


def argument_column(call: AggregateCall) -> str:
    return f"__arg_{call.name}"


def partial_fields(call: AggregateCall, argument: pa.DataType | None) -> list[pa.Field]:
    """The partials a row contributes to ``call``: a count of values, and their sum
    (integers as BIGINT, else DOUBLE, as keyflow's SUM) or their min or max."""
    count = pa.field(f"{call.name}.n", pa.int64())
    if call.function == "count":
        return [count]
    if call.function in ("sum", "avg"):
        assert argument is not None
        total = pa.int64() if pa.types.is_integer(argument) and call.function == "sum" else pa.float64()
        return [count, pa.field(f"{call.name}.v", total)]
    assert argument is not None
    return [count, pa.field(f"{call.name}.v", argument)]


def result_type(call: AggregateCall, argument: pa.DataType | None) -> pa.DataType:
    if call.function == "count":
        return pa.int64()
    if call.function == "avg":
        return pa.float64()
    return partial_fields(call, argument)[1].type


class OverRows(KeyedFunction):
    """The streaming OVER aggregation of one operator (see the module)."""

    timed = True

    def __init__(
        self,
        calls: tuple[AggregateCall, ...],
        over: OverFrame,
        row_type: pa.StructType,
        partials_type: pa.StructType,
        schema: pa.Schema,
        late: Accumulator[int] | None,
        watermark_before: int,
    ) -> None:
        self.calls, self.over, self.row_type, self.partials_type = calls, over, row_type, partials_type
        self.schema, self.late, self.watermark_before = schema, late, watermark_before

    @staticmethod
    def state(row_type: pa.StructType, partials_type: pa.StructType) -> dict[str, StateDescriptor]:
        return {
            PENDING: ListState(row_type),
            FIRE_AT: ValueState(pa.int64()),
            LAST_FIRED: ValueState(pa.int64()),
            HISTORY: ListState(partials_type),
        }

    def process(self, batch: KeyedBatch, state: KeyedState) -> None:
        """Rows after their key's last fired time wait for the watermark; the others are late
        (and, unbounded, rows at or before the watermark: Flink's two rules)."""
        column = batch.data.column(TIME).combine_chunks()
        times = np.asarray(column.fill_null(0).to_numpy(), dtype=np.int64)
        fired = state[LAST_FIRED].get()
        last = np.asarray(fired.fill_null(np.iinfo(np.int64).min).to_numpy(), dtype=np.int64)[batch.key_index]
        if self.over.preceding is None:  # AbstractRowTimeUnboundedPrecedingOver: ts <= watermark is late
            last = np.maximum(last, self.watermark_before)
        on_time = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool) & (times > last)
        if self.late is not None and not on_time.all():
            self.late.add(int((~on_time).sum()))
        rows = pa.StructArray.from_arrays(
            [batch.data.column(f.name).combine_chunks().cast(f.type) for f in self.row_type], fields=list(self.row_type)
        ).filter(pa.array(on_time))
        owners = batch.key_index[on_time]
        state[PENDING].add(rows, owners)
        earliest = np.full(batch.num_keys, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(earliest, owners, times[on_time])
        before = state[FIRE_AT].get()
        stored = np.asarray(before.fill_null(np.iinfo(np.int64).max).to_numpy(), dtype=np.int64)
        merged = np.minimum(stored, earliest)
        state[FIRE_AT].update(pa.array(merged, mask=merged == np.iinfo(np.int64).max, type=pa.int64()))

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[pa.Table]:
        slots = store.columns[FIRE_AT].at_most(time.watermark, len(store))
        if not len(slots):
            return
        pending_view, history_view = ListStateView(store, PENDING, slots), ListStateView(store, HISTORY, slots)
        pending = empty_if_null(pending_view.get())
        rows, owners = pc.list_flatten(pending), np.repeat(np.arange(len(slots)), list_lengths(pending))
        times = np.asarray(rows.field(TIME).to_numpy(zero_copy_only=False), dtype=np.int64)
        due = times <= time.watermark
        history = empty_if_null(history_view.get())
        output, kept, last_fired = self._fire(rows.filter(pa.array(due)), owners[due], history, len(slots))
        waiting = ~due
        offsets = pa.array(np.r_[0, np.cumsum(np.bincount(owners[waiting], minlength=len(slots)))], pa.int32())
        pending_view.update(pa.ListArray.from_arrays(offsets, rows.filter(pa.array(waiting))))
        next_fire = np.full(len(slots), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(next_fire, owners[waiting], times[waiting])
        ValueStateView(store, FIRE_AT, slots).update(
            pa.array(next_fire, mask=next_fire == np.iinfo(np.int64).max, type=pa.int64())
        )
        ValueStateView(store, LAST_FIRED, slots).update(pa.array(last_fired, pa.int64()))
        history_view.update(kept)
        yield output

    def _fire(
        self, rows: pa.StructArray, owners: Positions, history: pa.ListArray, keys: int
    ) -> tuple[pa.Table, pa.ListArray, Positions]:
        """The due ``rows`` (of keys ``owners``) with their aggregates; each key's history to
        keep; each key's last fired time."""
        kept_before = pc.list_flatten(history)
        history_owners = np.repeat(np.arange(keys), list_lengths(history))
        row_partials = self._row_partials(rows)
        partials = pa.concat_arrays([kept_before.cast(self.partials_type), row_partials])
        all_owners = np.r_[history_owners, owners]
        all_times = np.asarray(partials.field(TIME).to_numpy(zero_copy_only=False), dtype=np.int64)
        # history first (older), then due rows in arrival order: a stable sort by key and time
        order = np.lexsort((np.arange(len(all_owners)), all_times, all_owners))
        partials, all_owners, all_times = partials.take(pa.array(order)), all_owners[order], all_times[order]
        is_row = order >= len(history_owners)
        key_start = _key_starts(all_owners)
        starts, ends = self._frames(all_owners, all_times, key_start)
        values = {
            call.name: self._aggregate(call, partials, all_owners, key_start, starts[is_row], ends[is_row])
            for call in self.calls
        }
        fired_rows = rows.take(pa.array(order[is_row] - len(history_owners)))
        columns = {name: fired_rows.field(name) for name in self.schema.names if name not in values}
        output = pa.table({**columns, **values})
        last_fired = np.full(keys, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last_fired, all_owners, all_times)
        return output, self._kept(partials, all_owners, all_times, last_fired, keys), last_fired

    def _row_partials(self, rows: pa.StructArray) -> pa.StructArray:
        """Each due row's partials (and its time) as the partials type lays them out."""
        arrays: list[pa.Array] = [rows.field(TIME)]
        for call in self.calls:
            if call.argument is None:
                arrays.append(pa.array(np.ones(len(rows), dtype=np.int64)))
                continue
            value = rows.field(argument_column(call))
            arrays.append(pc.cast(value.is_valid(), pa.int64()))
            if call.function != "count":
                field = self.partials_type.field(f"{call.name}.v")
                if call.function in ("sum", "avg"):  # a BIGINT beyond 2^53 averages as the nearest DOUBLE
                    arrays.append(pc.fill_null(pc.cast(value, field.type, safe=False), 0))
                else:
                    arrays.append(value.cast(field.type))
        return pa.StructArray.from_arrays(arrays, fields=list(self.partials_type))

    def _frames(self, owners: Positions, times: Positions, key_start: Positions) -> tuple[Positions, Positions]:
        """Each position's frame ``[start, end)`` in the arrays sorted by key and time."""
        positions = np.arange(len(owners), dtype=np.int64)
        if self.over.rows:
            start = key_start if self.over.preceding is None else np.maximum(key_start, positions - self.over.preceding)
            return start, positions + 1
        ends = _bound(owners, times, owners, times, inclusive=True)  # RANGE: rows of an equal time are peers
        if self.over.preceding is None:
            return key_start, ends
        return _bound(owners, times, owners, times - self.over.preceding, inclusive=False), ends

    def _aggregate(
        self,
        call: AggregateCall,
        partials: pa.StructArray,
        owners: Positions,
        key_start: Positions,
        starts: Positions,
        ends: Positions,
    ) -> pa.Array:
        """One aggregate of each frame: counts and sums as differences of each key's own running
        sums (another key's values never enter them), min and max reduced over the frame."""
        n = _frame_sums(np.asarray(partials.field(f"{call.name}.n").to_numpy(), dtype=np.int64), owners, key_start,
                        starts, ends)  # fmt: skip
        if call.function == "count":
            return pa.array(n, pa.int64())
        values = partials.field(f"{call.name}.v")
        empty = n == 0
        if call.function in ("sum", "avg"):
            total = _frame_sums(np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False)), owners, key_start,
                                starts, ends)  # fmt: skip
            if call.function == "avg":
                return pa.array(total / np.where(empty, 1, n), pa.float64(), mask=empty)
            return pa.array(total, values.type, mask=empty)
        return _reduce(call.function, values, starts, ends, empty)

    def _kept(
        self, partials: pa.StructArray, owners: Positions, times: Positions, last_fired: Positions, keys: int
    ) -> pa.ListArray:
        """What each key's later frames still need of its partials (see the module)."""
        preceding = self.over.preceding
        if preceding is None:
            merged = self._merged(partials, owners, keys)
            has = np.bincount(owners, minlength=keys) > 0
            offsets = pa.array(np.r_[0, np.cumsum(has)], pa.int32())
            return pa.ListArray.from_arrays(offsets, merged.filter(pa.array(has)))
        if self.over.rows:
            counts = np.bincount(owners, minlength=keys)
            keep = counts[owners] - positions_within(counts) <= preceding  # each key's last ``preceding`` rows
        else:
            keep = times >= last_fired[owners] + 1 - preceding
        offsets = pa.array(np.r_[0, np.cumsum(np.bincount(owners[keep], minlength=keys))], pa.int32())
        return pa.ListArray.from_arrays(offsets, partials.filter(pa.array(keep)))

    def _merged(self, partials: pa.StructArray, owners: Positions, keys: int) -> pa.StructArray:
        """One row per key that had any: its partials merged (an unbounded frame's running state)."""
        counts = np.bincount(owners, minlength=keys)
        present = np.flatnonzero(counts)
        starts = (np.cumsum(counts) - counts)[present]
        ends = starts + counts[present]
        arrays: list[pa.Array] = [pa.array(np.maximum.reduceat(
            np.asarray(partials.field(TIME).to_numpy(), dtype=np.int64), starts), pa.int64())]  # fmt: skip
        for call in self.calls:
            n = np.add.reduceat(np.asarray(partials.field(f"{call.name}.n").to_numpy(), dtype=np.int64), starts)
            arrays.append(pa.array(n, pa.int64()))
            if call.function == "count":
                continue
            values = partials.field(f"{call.name}.v")
            if call.function in ("sum", "avg"):
                total = np.add.reduceat(np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False)), starts)
                arrays.append(pa.array(total, values.type))
            else:
                arrays.append(_reduce(call.function, values, starts, ends, n == 0))
        return pa.StructArray.from_arrays(arrays, fields=list(self.partials_type))


def _key_starts(owners: Positions) -> Positions:
    """For each position of arrays sorted by key: where its key's positions start."""
    positions = np.arange(len(owners), dtype=np.int64)
    first = np.r_[True, owners[1:] != owners[:-1]] if len(owners) else np.zeros(0, dtype=bool)
    return np.maximum.accumulate(np.where(first, positions, 0)) if len(owners) else positions


def _frame_sums(
    values: npt.NDArray[Any], owners: Positions, key_start: Positions, starts: Positions, ends: Positions
) -> npt.NDArray[Any]:
    """The sum of ``values[start:end]`` per frame, from running sums restarted at each key (as a
    key's accumulator adds and retracts in Flink: a NaN stays in it)."""
    running = pd.Series(values).groupby(owners, sort=False).cumsum(skipna=False).to_numpy()
    if not len(ends):
        return running[:0]
    before = np.where(starts > key_start[starts], running[np.maximum(starts - 1, 0)], 0)
    return running[ends - 1] - before


def _reduce(
    function: str, values: pa.Array, starts: Positions, ends: Positions, empty: npt.NDArray[np.bool_]
) -> pa.Array:
    """MIN or MAX of ``values[start:end]`` for each range (nulls skipped; null where none)."""
    storage = values.type
    numbers = values.view(pa.int64()) if pa.types.is_timestamp(storage) else values
    numbers = numbers.view(pa.int32()) if pa.types.is_date32(storage) else numbers
    array = np.asarray(numbers.to_numpy(zero_copy_only=False)) if not numbers.null_count else None
    if array is None:
        kind = np.asarray(numbers.drop_null().to_numpy(zero_copy_only=False)).dtype
        fill = _extreme(kind, function)
        array = np.asarray(numbers.fill_null(fill).to_numpy(zero_copy_only=False))
    ufunc = np.minimum if function == "min" else np.maximum
    padded = np.r_[array, array[:1]] if len(array) else array
    bounds = np.ravel(np.column_stack([starts, ends]))
    reduced = ufunc.reduceat(padded, bounds)[::2] if len(bounds) else padded[:0]
    result = pa.array(reduced, numbers.type, mask=empty)
    return result.view(storage) if result.type != storage else result


def _extreme(kind: np.dtype[Any], function: str) -> Any:
    """The value MIN (MAX) never picks over a real one: the type's largest (smallest)."""
    if np.issubdtype(kind, np.floating):
        return np.inf if function == "min" else -np.inf
    info = np.iinfo(kind)
    return info.max if function == "min" else info.min


def _bound(
    owners: Positions, times: Positions, at_owners: Positions, at_times: Positions, inclusive: bool
) -> Positions:
    """For each (key, time) query: how many of the sorted (key, time) pairs come before it
    (``inclusive``: those equal too): one lexicographic sort of both together."""
    data, queries = len(owners), len(at_owners)
    flag = np.r_[np.full(data, 0 if inclusive else 1), np.full(queries, 1 if inclusive else 0)]
    order = np.lexsort((flag, np.r_[times, at_times], np.r_[owners, at_owners]))
    is_query = order >= data
    data_before = np.cumsum(~is_query) - (~is_query)
    found = np.empty(queries, dtype=np.int64)
    found[order[is_query] - data] = data_before[is_query]
    return found
