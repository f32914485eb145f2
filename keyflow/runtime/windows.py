"""Event-time windows in the workers: partials merged per window, fired by the watermark.

Spark assigns rows to windows and aggregates each micro-batch (``keyflow.runtime.window_assign``);
these keyed functions merge those partials into state and, when time advances, emit every
window whose end the watermark passed (Flink's ``WindowOperator``: a window fires once its
``end - 1`` is at or before the watermark, and is kept ``allowed_lateness`` longer so a late row
updates it). All of it is vectorised: due windows are one NumPy comparison over a fixed-width
column, sessions merge by sorting and a grouped running maximum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Accumulator

from keyflow.errors import DataError, WorkerError
from keyflow.plan.aggregates import AggregateCall
from keyflow.plan.descriptors import ListState, StateDescriptor, ValueState
from keyflow.plan.event_time import EVENT_TIME
from keyflow.plan.nodes import IS_UPDATE, WINDOW_END, WINDOW_START
from keyflow.runtime.aggregates import final_values, merge_partials, partials
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.state.keyed import KeyedBatch, KeyedState
from keyflow.state.memory import KeyedStateStore
from keyflow.state.timers import TIMESTAMP, TaskTime, window_fires_at

FIRE_AT, CLEANUP_AT, EMITTED = "__fire_at", "__cleanup_at", "__emitted"
ROWS, ROW_PREFIX = "__rows", "__row_"  # a window's rows; the row columns as they reach the worker
STARTS, ENDS, DIRTY = "__starts", "__ends", "__dirty"
ROW_COUNT, STORED = "__row_count", "__stored"  # rows in a micro-batch's session; whether one was in state
START_MICROS, END_MICROS = "__start_us", "__end_us"  # a micro-batch's sessions, from Spark
MERGE_RULES = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}


def partial_rules(calls: tuple[AggregateCall, ...]) -> dict[str, str]:
    """Each partial column and how two partials of it combine (Arrow's hash aggregate)."""
    return {column: MERGE_RULES[rule] for call in calls for column, (rule, _) in partials(call).items()}


class WindowSlots(KeyedFunction):
    """Tumbling and sliding windows: one state slot per (key, window) with when it fires
    (``end - 1``), when it is dropped (``+ lateness``) and whether it was emitted; subclasses
    say what a slot holds (``contents``, ``add``) and what a fired window emits (``fire``)."""

    timed = True
    lateness = 0
    domain = EVENT_TIME  # the time windows fire by: the watermark, or the processing time

    @classmethod
    def timing(cls) -> dict[str, StateDescriptor]:
        return {FIRE_AT: ValueState(pa.int64()), CLEANUP_AT: ValueState(pa.int64()), EMITTED: ValueState(pa.bool_())}

    def add(self, batch: KeyedBatch, state: KeyedState) -> None:
        raise NotImplementedError

    def fire(self, due: npt.NDArray[np.int64], store: KeyedStateStore) -> Any:
        raise NotImplementedError

    def process(self, batch: KeyedBatch, state: KeyedState) -> None:
        self.add(batch, state)
        last = window_fires_at(batch.keys.column(WINDOW_END))
        state[FIRE_AT].update(last)  # a row for a window that fired already fires it again: an update
        state[CLEANUP_AT].update(pc.add(last, self.lateness))

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[Any]:
        due = store.columns[FIRE_AT].at_most(time.until(self.domain), len(store))
        if len(due):
            fired = self.fire(due, store)
            store.columns[FIRE_AT].set(due, pa.nulls(len(due), pa.int64()))
            store.columns[EMITTED].set(due, pa.array(np.ones(len(due), dtype=bool)))
            store.touch(due)
            yield fired
        _drop(store, store.columns[CLEANUP_AT].at_most(time.until(self.domain), len(store)))


class WindowMerge(WindowSlots):
    """Tumbling and sliding windows: one state slot per (key, window) holding the merged
    partials, when it fires (``end - 1``) and when it is dropped (``+ allowed_lateness``)."""

    def __init__(
        self, calls: tuple[AggregateCall, ...], lateness: int, marks_updates: bool, domain: str = EVENT_TIME
    ) -> None:
        self.calls, self.lateness, self.marks_updates, self.domain = calls, lateness, marks_updates, domain

    @classmethod
    def state(cls, partial_types: dict[str, pa.DataType]) -> dict[str, StateDescriptor]:
        return {**{column: ValueState(kind) for column, kind in partial_types.items()}, **cls.timing()}

    def add(self, batch: KeyedBatch, state: KeyedState) -> None:
        merge_partials(self.calls, batch, state)

    def fire(self, due: npt.NDArray[np.int64], store: KeyedStateStore) -> pa.Table:
        merged = {column: store.columns[column].get(due) for column in partial_rules(self.calls)}
        rows = store.keys(due)
        for name, values in final_values(self.calls, merged).items():
            rows = rows.append_column(name, values)
        if self.marks_updates:
            rows = rows.append_column(IS_UPDATE, store.columns[EMITTED].get(due).fill_null(False))
        return rows


class WindowRows(WindowSlots):
    """Tumbling and sliding windows of rows (Flink's ``ProcessWindowFunction``): each slot holds
    its window's rows as a list; when windows fire, the user's function runs once over all of
    them (a :class:`KeyedBatch` whose keys are the key columns with ``window_start`` and
    ``window_end``)."""

    def __init__(self, function: Callable[..., Any], operator: str, columns: list[str], lateness: int) -> None:
        self.function, self.operator, self.columns, self.lateness = function, operator, columns, lateness
        self.subtask = 0

    @classmethod
    def state(cls, row_type: pa.StructType) -> dict[str, StateDescriptor]:
        return {ROWS: ListState(row_type), **cls.timing()}

    def open(self, subtask: int, key_groups: tuple[int, int]) -> None:
        self.subtask = subtask

    def add(self, batch: KeyedBatch, state: KeyedState) -> None:
        data = batch.data
        rows = pa.StructArray.from_arrays(
            [data.column(f"{ROW_PREFIX}{c}").combine_chunks() for c in self.columns], names=self.columns
        )
        state[ROWS].add(rows, batch.key_index)

    def fire(self, due: npt.NDArray[np.int64], store: KeyedStateStore) -> Any:
        lists = store.columns[ROWS].get(due)
        counts = np.asarray(lists.value_lengths().fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        data = pa.Table.from_struct_array(lists.flatten()) if len(lists) else pa.table({})
        key_groups = store.key_groups(due)
        windows = KeyedBatch(
            data, store.keys(due), np.repeat(np.arange(len(due)), counts), np.cumsum(counts) - counts, counts,
            key_groups, self.subtask, np.repeat(key_groups, counts),
        )  # fmt: skip
        result = self.function(windows)
        if result is None:
            raise WorkerError(DataError(f"{self.operator} returned None; return a table (an empty one for none)"))
        return result


class SessionMerge(KeyedFunction):
    """Session windows: per key, its sessions as lists (bounds, partials, whether emitted,
    whether changed since) and the earliest time one of them is due (``__fire_at``). A
    micro-batch's sessions merge with the stored ones they touch (Flink's
    ``TimeWindow.intersects``: ``start <= other end`` and ``end >= other start``). As in Flink's
    ``WindowOperator``, lateness is decided after merging: a row bridging into an open session
    is not late; a new session already past ``watermark_before`` plus the lateness is dropped,
    its rows counted in ``late``."""

    timed = True

    def __init__(
        self, calls: tuple[AggregateCall, ...], lateness: int, watermark_before: int, late: Accumulator[int] | None
    ) -> None:
        self.calls, self.lateness, self.watermark_before, self.late = calls, lateness, watermark_before, late
        self.marks_updates = lateness > 0
        self.rules = partial_rules(calls)

    @staticmethod
    def state(partial_types: dict[str, pa.DataType]) -> dict[str, StateDescriptor]:
        lists = {column: ListState(kind) for column, kind in partial_types.items()}
        bounds = {STARTS: ListState(pa.int64()), ENDS: ListState(pa.int64())}
        flags = {EMITTED: ListState(pa.bool_()), DIRTY: ListState(pa.bool_())}
        return {**lists, **bounds, **flags, FIRE_AT: ValueState(pa.int64())}

    def _columns(self) -> list[str]:
        return [STARTS, ENDS, EMITTED, DIRTY, *self.rules]

    def process(self, batch: KeyedBatch, state: KeyedState) -> None:
        stored = _flatten({c: state[c].get() for c in self._columns()})
        stored = stored.append_column(STORED, pa.array(np.ones(stored.num_rows, dtype=bool)))
        stored = stored.append_column(ROW_COUNT, pa.array(np.zeros(stored.num_rows, dtype=np.int64)))
        rows = batch.data.num_rows
        incoming = pa.table(
            {
                "__owner": pa.array(batch.key_index, pa.int64()),
                STARTS: batch.data.column(START_MICROS),
                ENDS: batch.data.column(END_MICROS),
                EMITTED: pa.array(np.zeros(rows, dtype=bool)),
                DIRTY: pa.array(np.ones(rows, dtype=bool)),
                **{c: batch.data.column(c) for c in self.rules},
                STORED: pa.array(np.zeros(rows, dtype=bool)),
                ROW_COUNT: batch.data.column(ROW_COUNT),
            }
        )
        rules = {**self.rules, STORED: "max", ROW_COUNT: "sum"}
        merged = _merge_sessions(pa.concat_tables([stored, incoming.cast(stored.schema)]), rules)
        ends = merged.column(ENDS).to_numpy()
        late = ~merged.column(STORED).to_numpy(zero_copy_only=False) & (
            ends - 1 + self.lateness <= self.watermark_before
        )
        if late.any():
            if self.late is not None:
                self.late.add(int(merged.column(ROW_COUNT).to_numpy()[late].sum()))
            merged = merged.filter(pa.array(~late))
        self._store(merged, batch.num_keys, lambda column, values: state[column].update(values))

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[Any]:
        due = store.columns[FIRE_AT].at_most(time.watermark, len(store))
        if not len(due):
            return
        sessions = _flatten({c: store.columns[c].get(due) for c in self._columns()})
        ends = sessions.column(ENDS).to_numpy()
        dirty = sessions.column(DIRTY).to_numpy(zero_copy_only=False)
        fire = dirty & (ends - 1 <= time.watermark)
        fired = sessions.filter(pa.array(fire))
        if fired.num_rows:
            owners = fired.column("__owner").to_numpy()
            rows = store.keys(due).take(pa.array(owners))
            rows = rows.append_column(WINDOW_START, fired.column(STARTS).cast(TIMESTAMP))
            rows = rows.append_column(WINDOW_END, fired.column(ENDS).cast(TIMESTAMP))
            values = {c: fired.column(c).combine_chunks() for c in self.rules}
            for name, value in final_values(self.calls, values).items():
                rows = rows.append_column(name, value)
            if self.marks_updates:
                rows = rows.append_column(IS_UPDATE, fired.column(EMITTED))
            yield rows
        emitted = sessions.column(EMITTED).to_numpy(zero_copy_only=False) | fire
        kept = ends - 1 + self.lateness > time.watermark
        sessions = sessions.set_column(sessions.schema.get_field_index(EMITTED), EMITTED, pa.array(emitted))
        sessions = sessions.set_column(sessions.schema.get_field_index(DIRTY), DIRTY, pa.array(dirty & ~fire))
        self._store(sessions.filter(pa.array(kept)), len(due), lambda c, v: store.columns[c].set(due, v))
        store.touch(due)

    def _store(self, sessions: pa.Table, keys: int, write: Any) -> None:
        """Sessions (sorted by owner) back into per-key lists; the next time each key is due."""
        owners = sessions.column("__owner").to_numpy()
        counts = np.bincount(owners, minlength=keys)
        offsets = pa.array(np.concatenate(([0], np.cumsum(counts))).astype(np.int32))
        empty = pa.array(counts == 0)
        for column in self._columns():
            write(column, pa.ListArray.from_arrays(offsets, sessions.column(column).combine_chunks(), mask=empty))
        ends = sessions.column(ENDS).to_numpy()
        dirty = sessions.column(DIRTY).to_numpy(zero_copy_only=False)
        due_at = np.where(dirty, ends - 1, ends - 1 + self.lateness)
        earliest = np.full(keys, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(earliest, owners, due_at)
        write(FIRE_AT, pa.array(earliest, pa.int64(), mask=counts == 0))


def _flatten(lists: dict[str, pa.ListArray]) -> pa.Table:
    """Per-key lists as one row per element, with its key's position in ``__owner``."""
    first = next(iter(lists.values()))
    owners = first.value_parent_indices() if len(first) else pa.array([], pa.int64())
    columns = {"__owner": pa.array(owners, pa.int64())}
    columns.update({name: values.flatten() for name, values in lists.items()})
    return pa.table(columns)


def _merge_sessions(sessions: pa.Table, rules: dict[str, str]) -> pa.Table:
    """Sessions of each owner merged where they intersect (touching ones too, as Flink);
    sorted by owner and start."""
    sessions = sessions.sort_by([("__owner", "ascending"), (STARTS, "ascending")])
    owners = sessions.column("__owner").to_numpy()
    starts, ends = sessions.column(STARTS).to_numpy(), sessions.column(ENDS).to_numpy()
    reach = pd.Series(ends).groupby(owners).cummax().to_numpy()
    new = np.ones(len(owners), dtype=bool)
    if len(owners) > 1:
        new[1:] = (owners[1:] != owners[:-1]) | (starts[1:] > reach[:-1])
    group = np.cumsum(new) - 1
    table = sessions.append_column("__group", pa.array(group))
    wanted = [("__owner", "min"), (STARTS, "min"), (ENDS, "max"), (EMITTED, "max"), (DIRTY, "max")]
    wanted += list(rules.items())
    merged = table.group_by("__group", use_threads=False).aggregate(wanted).sort_by("__group")
    names = {f"{column}_{rule}": column for column, rule in wanted}
    return merged.select(list(names)).rename_columns(list(names.values()))


def _drop(store: KeyedStateStore, slots: npt.NDArray[np.int64]) -> None:
    """Windows past their allowed lateness: every column cleared (compaction forgets them)."""
    if len(slots):
        for column in store.columns.values():
            column.set(slots, pa.nulls(len(slots), column.type))
        store.touch(slots)
