"""A regular join in the workers (Flink's ``StreamingJoinOperator``), vectorised per call.

Each input's rows of a key live in a list state of row structs. A call's rows of the left
input arrive first: each is paired with the right rows stored for its key, then stored
itself; then the right input's rows do the same against the left rows (this call's
included). So every matching pair is emitted exactly once, in whatever order rows arrive.

Outer joins keep, beside each stored row of a preserved input, how many rows of the other
input it has matched. A preserved row that arrives without a match is emitted padded with
nulls (``+I``); when its first match arrives, the padded row is retracted (``-D``) before
the joined rows are emitted, as Flink does. The output is then a changelog whose current
table is the batch join.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.changelog import DELETE, INSERT, OP
from keyflow.plan.descriptors import ListState, StateDescriptor, ValueState
from keyflow.plan.event_time import END_OF_INPUT, NO_WATERMARK
from keyflow.plan.nodes import WINDOW_END
from keyflow.runtime.connected import INPUT, PACKED
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.state.key_index import Slots
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
from keyflow.state.timers import TaskTime, window_fires_at

Positions = npt.NDArray[np.int64]
ROWS, MATCHES = ("__left_rows", "__right_rows"), ("__left_matches", "__right_matches")
WRITTEN = "__written"  # a regular join's key: when its state was last written (idle state retention)


@dataclass(frozen=True)
class JoinSides:
    """The join's shape: which inputs are preserved (outer), each input's row struct type and
    the columns of it the output keeps (its keys are the output's key columns)."""

    preserved: tuple[bool, bool]
    row_types: tuple[pa.StructType, pa.StructType]
    kept: tuple[tuple[str, ...], tuple[str, ...]]
    changelog: bool

    def state(self) -> dict[str, StateDescriptor]:
        state: dict[str, StateDescriptor] = {ROWS[side]: ListState(self.row_types[side]) for side in (0, 1)}
        state.update({MATCHES[side]: ListState(pa.int64()) for side in (0, 1) if self.preserved[side]})
        return state


class JoinRows(KeyedFunction):
    """Rows of both inputs of a call joined against the state, then stored (see the module)."""

    stamped: ClassVar[bool] = True  # keeps when each key was last written (``state_of``)

    def __init__(self, sides: JoinSides, schema: pa.Schema) -> None:
        self.sides, self.schema = sides, schema

    @staticmethod
    def state_of(sides: JoinSides) -> dict[str, StateDescriptor]:
        """What a regular join stores: each side's rows (and match counts), and when each key
        was last written (always kept, so turning ``table.exec.state.ttl`` on or off keeps the
        checkpoint's state layout)."""
        return {**sides.state(), WRITTEN: ValueState(pa.int64())}

    def process(self, batch: KeyedBatch, state: KeyedState) -> Any:
        tags = batch.data.column(INPUT).to_numpy()
        out: list[pa.Table] = []
        if self.stamped:  # a regular join: stamped for table.exec.state.ttl, on or off
            state[WRITTEN].update(pa.array(np.full(batch.num_keys, state.now, dtype=np.int64)))
        for side in (0, 1):
            rows = np.flatnonzero(tags == side)
            if len(rows):
                packed = batch.data.column(PACKED[side]).take(pa.array(rows)).combine_chunks()
                arrived, positions = batch.of_rows(rows, pa.table({"row": packed}))
                out.extend(self._arrive(side, arrived, packed, state.of_keys(positions)))
        return pa.concat_tables(out) if out else None

    def _arrive(self, side: int, batch: KeyedBatch, rows: pa.StructArray, state: KeyedState) -> list[pa.Table]:
        other = 1 - side
        stored = empty_if_null(state[ROWS[other]].get())
        lengths = list_lengths(stored)
        stored_rows = pc.list_flatten(stored)
        before = np.cumsum(lengths) - lengths  # where each key's stored rows start in stored_rows
        candidates = lengths[batch.key_index]  # for each arriving row: its key's stored rows
        mine = np.repeat(np.arange(len(rows)), candidates)
        theirs = np.repeat(before[batch.key_index], candidates) + positions_within(candidates)
        mine, theirs = self._matching(side, rows, stored_rows, mine, theirs)
        out = []
        if self.sides.preserved[other]:
            counts_view = state[MATCHES[other]]
            counts = np.asarray(pc.list_flatten(empty_if_null(counts_view.get())).to_numpy(), dtype=np.int64)
            hits = np.bincount(theirs, minlength=len(counts))
            first = np.flatnonzero((counts == 0) & (hits > 0))  # padded rows of the other input to retract
            if self.sides.changelog and len(first):
                owners = np.repeat(np.arange(len(lengths)), lengths)[first]
                out.append(
                    self._rows(batch.keys.take(pa.array(owners)), side, None, stored_rows.take(pa.array(first)), DELETE)
                )
            offsets = pa.array(np.r_[0, np.cumsum(lengths)], pa.int32())  # a key with no rows: null, not []
            counts_view.update(pa.ListArray.from_arrays(offsets, pa.array(counts + hits), mask=pa.array(lengths == 0)))
        if len(mine):
            keys = batch.keys.take(pa.array(batch.key_index[mine]))
            out.append(self._rows(keys, side, rows.take(pa.array(mine)), stored_rows.take(pa.array(theirs)), INSERT))
        if self.sides.preserved[side]:
            matches = np.bincount(mine, minlength=len(rows))
            alone = np.flatnonzero(matches == 0)
            if self.sides.changelog and len(alone):
                keys = batch.keys.take(pa.array(batch.key_index[alone]))
                out.append(self._rows(keys, side, rows.take(pa.array(alone)), None, INSERT))
            state[MATCHES[side]].add(pa.array(matches, pa.int64()), batch.key_index)
        state[ROWS[side]].add(rows, batch.key_index)
        return out

    def _matching(
        self, side: int, rows: pa.StructArray, stored: pa.Array, mine: Positions, theirs: Positions
    ) -> tuple[Positions, Positions]:
        """Of the pairs (arriving row ``mine[i]``, stored row ``theirs[i]``) of equal keys, those
        that join: all of them, in a regular join."""
        return mine, theirs

    def _rows(
        self, keys: pa.Table, side: int, mine: pa.StructArray | None, theirs: pa.StructArray | None, op: str
    ) -> pa.Table:
        """Output rows: the keys, then the left input's kept columns, then the right's."""
        by_side = {side: mine, 1 - side: theirs}
        columns = dict(zip(keys.column_names, keys.columns, strict=True))
        for position in (0, 1):
            found = by_side[position]
            for name in self.sides.kept[position]:
                kind = self.sides.row_types[position].field(name).type
                columns[name] = found.field(name) if found is not None else pa.nulls(keys.num_rows, kind)
        if self.sides.changelog:
            columns[OP] = pa.repeat(pa.scalar(op, pa.string()), keys.num_rows)
        return pa.table(columns)


class IdleJoinRows(JoinRows):
    """A regular join under ``table.exec.state.ttl`` (Flink's idle state retention): each call
    stamps its keys with the processing time; :meth:`advance` clears every key not written
    for ``ttl`` microseconds, both inputs' rows at once, so the lists never disagree."""

    timed = True

    def __init__(self, sides: JoinSides, schema: pa.Schema, ttl: int) -> None:
        super().__init__(sides, schema)
        self.ttl = ttl

    def process(self, batch: KeyedBatch, state: KeyedState) -> Any:
        written = state[WRITTEN].get().fill_null(state.now)
        idle = np.flatnonzero(pc.less_equal(written, state.now - self.ttl).to_numpy(zero_copy_only=False))
        if len(idle):  # expired but not cleared yet: never read (Flink's NeverReturnExpired)
            stale = state.of_keys(idle)
            for name in self.state_of(self.sides):
                stale[name].clear()
        return super().process(batch, state)

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[Any]:
        written = store.columns[WRITTEN]
        unstamped = store.live_slots()
        unstamped = unstamped[~written.valid(len(store))[unstamped]]  # restored from before the stamps
        if len(unstamped):
            written.set(unstamped, pa.array(np.full(len(unstamped), time.processing_time, dtype=np.int64)))
            store.touch(unstamped)
        store.clear(written.at_most(time.processing_time - self.ttl, len(store)))
        return iter(())


EXPIRY = ("__left_expiry", "__right_expiry")


TIME_FIELD = "__event_us"  # an interval join's rows: their event time in microseconds, as Spark reads it


@dataclass(frozen=True)
class Interval:
    """An interval join's time condition: ``lower <= right time - left time <= upper``
    (microseconds), each row's time in its field ``TIME_FIELD``."""

    lower: int
    upper: int

    def expiry(self, side: int, times: Positions) -> Positions:
        """When rows of ``side`` at ``times`` leave the state: once the watermark reaches the
        last time a row of the other input could match them (later rows of it are later than
        the watermark)."""
        return times + self.upper if side == 0 else times - self.lower

    @staticmethod
    def times(rows: pa.StructArray) -> Positions:
        """The rows' event times (a row without one: the earliest time, so it matches nothing
        and leaves at the first watermark)."""
        return np.asarray(rows.field(TIME_FIELD).fill_null(NO_WATERMARK // 2).to_numpy(), dtype=np.int64)


class IntervalJoinRows(JoinRows):
    """A :class:`JoinRows` whose pairs must also be close in event time; each key keeps, per
    input, the earliest time one of its rows leaves the state, so :meth:`advance` finds the
    keys with rows to drop by one comparison over that column. A row of a preserved input
    that leaves without a match is emitted then, padded with nulls."""

    stamped = False  # its rows leave by event time

    timed = True

    def __init__(self, sides: JoinSides, schema: pa.Schema, interval: Interval) -> None:
        super().__init__(sides, schema)
        self.interval = interval

    def _matching(
        self, side: int, rows: pa.StructArray, stored: pa.Array, mine: Positions, theirs: Positions
    ) -> tuple[Positions, Positions]:
        if not len(mine):
            return mine, theirs
        interval = self.interval
        arriving, other = interval.times(rows)[mine], interval.times(stored)[theirs]  # int64s, not whole rows
        distance = other - arriving if side == 0 else arriving - other  # right time - left time
        valid = arriving > NO_WATERMARK // 2
        within = valid & (other > NO_WATERMARK // 2) & (distance >= interval.lower) & (distance <= interval.upper)
        return mine[within], theirs[within]

    def _arrive(self, side: int, batch: KeyedBatch, rows: pa.StructArray, state: KeyedState) -> list[pa.Table]:
        out = super()._arrive(side, batch, rows, state)
        earliest = np.full(batch.num_keys, END_OF_INPUT, dtype=np.int64)
        np.minimum.at(earliest, batch.key_index, self.interval.expiry(side, self.interval.times(rows)))
        view = state[EXPIRY[side]]
        stored = np.asarray(view.get().fill_null(END_OF_INPUT).to_numpy(), dtype=np.int64)
        view.update(pa.array(np.minimum(stored, earliest), pa.int64()))
        return out

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[Any]:
        """Drop the rows the watermark passed; emit a preserved input's unmatched ones padded.
        Each input's lists are rewritten only for the keys with a row of it due."""
        for side in (0, 1):
            slots = store.columns[EXPIRY[side]].at_most(time.watermark, len(store))
            if not len(slots):
                continue
            store.touch(slots)
            padded = self._leave(side, slots, store, time.watermark)
            if padded is not None:
                owners, rows = padded
                yield self._rows(store.keys(slots).take(pa.array(owners)), side, rows, None, INSERT)

    def _leave(
        self, side: int, slots: Slots, store: KeyedStateStore, watermark: int
    ) -> tuple[npt.NDArray[np.int64], pa.StructArray] | None:
        """Keep the rows of ``side`` that may still match; the unmatched ones that leave, of a
        preserved input (their keys' positions among ``slots``, the rows), or None."""
        rows_view = ListStateView(store, ROWS[side], slots)
        stored = empty_if_null(rows_view.get())
        lengths = list_lengths(stored)
        flat = pc.list_flatten(stored)
        owners = np.repeat(np.arange(len(slots), dtype=np.int64), lengths)
        expiry = self.interval.expiry(side, self.interval.times(flat))
        keep = expiry > watermark
        kept = np.bincount(owners[keep], minlength=len(slots))
        offsets, empty = pa.array(np.r_[0, np.cumsum(kept)], pa.int32()), pa.array(kept == 0)
        rows_view.update(pa.ListArray.from_arrays(offsets, flat.filter(pa.array(keep)), mask=empty))
        earliest = np.full(len(slots), END_OF_INPUT, dtype=np.int64)
        np.minimum.at(earliest, owners[keep], expiry[keep])
        ValueStateView(store, EXPIRY[side], slots).update(pa.array(earliest, pa.int64(), mask=kept == 0))
        if not self.sides.preserved[side]:
            return None
        counts_view = ListStateView(store, MATCHES[side], slots)
        counts = np.asarray(pc.list_flatten(empty_if_null(counts_view.get())).to_numpy(), dtype=np.int64)
        counts_view.update(pa.ListArray.from_arrays(offsets, pa.array(counts[keep], pa.int64()), mask=empty))
        unmatched = np.flatnonzero(~keep & (counts == 0))
        return (owners[unmatched], flat.take(pa.array(unmatched))) if len(unmatched) else None


def expiry_state() -> dict[str, StateDescriptor]:
    """An interval join's hidden state beside the rows: per input, each key's earliest expiry."""
    return {name: ValueState(pa.int64()) for name in EXPIRY}


WINDOW_ENDS = "__window_ends"  # a window join's key (key and window): when its window's rows leave


class WindowJoinRows(JoinRows):
    """A :class:`JoinRows` whose state is kept by key and window (the window is part of the
    state's key), so pairs are rows of one window; each (key, window) records when its window
    ends, so :meth:`advance` finds the windows the watermark passed by one comparison and
    drops their rows, emitting a preserved input's unmatched rows padded."""

    stamped = False  # its rows leave by event time

    timed = True

    def _arrive(self, side: int, batch: KeyedBatch, rows: pa.StructArray, state: KeyedState) -> list[pa.Table]:
        out = super()._arrive(side, batch, rows, state)
        state[WINDOW_ENDS].update(window_fires_at(batch.keys.column(WINDOW_END)))
        return out

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[Any]:
        slots = store.columns[WINDOW_ENDS].at_most(time.watermark, len(store))
        if not len(slots):
            return
        keys = store.keys(slots)
        for side in (0, 1):
            if self.sides.preserved[side]:
                stored = empty_if_null(ListStateView(store, ROWS[side], slots).get())
                lengths = list_lengths(stored)
                counts = empty_if_null(ListStateView(store, MATCHES[side], slots).get())
                unmatched = np.flatnonzero(np.asarray(pc.list_flatten(counts).to_numpy(), dtype=np.int64) == 0)
                if len(unmatched):
                    owners = np.repeat(np.arange(len(slots), dtype=np.int64), lengths)[unmatched]
                    rows = pc.list_flatten(stored).take(pa.array(unmatched))
                    yield self._rows(keys.take(pa.array(owners)), side, rows, None, INSERT)
        store.clear(slots)


def window_state() -> dict[str, StateDescriptor]:
    """A window join's hidden state beside the rows: when each key's window ends."""
    return {WINDOW_ENDS: ValueState(pa.int64())}
