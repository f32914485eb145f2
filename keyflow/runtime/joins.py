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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.changelog import DELETE, INSERT, OP, RETRACTIONS
from keyflow.plan.descriptors import ListState, StateDescriptor, ValueState
from keyflow.plan.event_time import END_OF_INPUT, NO_WATERMARK
from keyflow.plan.nodes import WINDOW_END
from keyflow.runtime.connected import INPUT, PACKED
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.runtime.row_changes import equal_rows_to_remove, net_changes, per_key
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
Arrive = Callable[[int, KeyedBatch, pa.StructArray, KeyedState], list[pa.Table]]
ROWS, MATCHES = ("__left_rows", "__right_rows"), ("__left_matches", "__right_matches")
ROW_KIND = "__row_kind"  # a changelog join's rows: each one's row kind, from whichever input it came
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
        out: list[pa.Table] = []
        if self.stamped:  # a regular join: stamped for table.exec.state.ttl, on or off
            state[WRITTEN].update(pa.array(np.full(batch.num_keys, state.now, dtype=np.int64)))
        for side, rows, arrive in self._arrivals(batch):
            packed = batch.data.column(PACKED[side]).take(pa.array(rows)).combine_chunks()
            arrived, positions = batch.of_rows(rows, pa.table({"row": packed}))
            out.extend(arrive(side, arrived, packed, state.of_keys(positions)))
        return pa.concat_tables(out) if out else None

    def _arrivals(self, batch: KeyedBatch) -> Iterator[tuple[int, Positions, Arrive]]:
        """The call's rows in the order they are taken: the left input's, then the right's."""
        tags = batch.data.column(INPUT).to_numpy()
        for side in (0, 1):
            rows = np.flatnonzero(tags == side)
            if len(rows):
                yield side, rows, self._arrive

    def _pairs(
        self, side: int, batch: KeyedBatch, rows: pa.StructArray, state: KeyedState
    ) -> tuple[pa.Array, Positions, Positions, Positions]:
        """The other input's stored rows of the keys (flat), how many each key has, and the
        joining pairs (arriving row ``mine[i]``, stored row ``theirs[i]``)."""
        stored = empty_if_null(state[ROWS[1 - side]].get())
        lengths = list_lengths(stored)
        stored_rows = pc.list_flatten(stored)
        before = np.cumsum(lengths) - lengths  # where each key's stored rows start in stored_rows
        candidates = lengths[batch.key_index]  # for each arriving row: its key's stored rows
        mine = np.repeat(np.arange(len(rows)), candidates)
        theirs = np.repeat(before[batch.key_index], candidates) + positions_within(candidates)
        mine, theirs = self._matching(side, rows, stored_rows, mine, theirs)
        return stored_rows, lengths, mine, theirs

    def _arrive(self, side: int, batch: KeyedBatch, rows: pa.StructArray, state: KeyedState) -> list[pa.Table]:
        other = 1 - side
        stored_rows, lengths, mine, theirs = self._pairs(side, batch, rows, state)
        out = []
        if self.sides.preserved[other]:
            before, after = self._count_matches(state[MATCHES[other]], lengths, theirs, 1)
            first = np.flatnonzero((before == 0) & (after > 0))  # padded rows of the other input to retract
            if self.sides.changelog and len(first):
                out.append(self._padded(batch, lengths, side, stored_rows, first, DELETE))
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

    @staticmethod
    def _count_matches(
        view: ListStateView, lengths: Positions, theirs: Positions, sign: int
    ) -> tuple[Positions, Positions]:
        """The match counts of a preserved input's stored rows (flat; ``lengths`` per key)
        before and after each pair's stored row ``theirs[i]`` gains (or loses) one."""
        before = np.asarray(pc.list_flatten(empty_if_null(view.get())).to_numpy(), dtype=np.int64)
        after = before + sign * np.bincount(theirs, minlength=len(before))
        view.update(per_key(pa.array(after), lengths))
        return before, after

    def _padded(
        self, batch: KeyedBatch, lengths: Positions, side: int, stored: pa.Array, chosen: Positions, op: str
    ) -> pa.Table:
        """The other input's ``chosen`` stored rows (flat; ``lengths`` per key) padded with nulls."""
        owners = np.repeat(np.arange(len(lengths)), lengths)[chosen]
        return self._rows(batch.keys.take(pa.array(owners)), side, None, stored.take(pa.array(chosen)), op)

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


class ChangelogJoinRows(JoinRows):
    """A regular join of changelogs (Flink's ``StreamingJoinOperator`` with retractions).

    Each input's rows of a call are taken in two steps. Its inserts and update-afters (``+I``,
    ``+U``) join and are stored as in :class:`JoinRows`. Then its retractions (``-U``, ``-D``)
    pair with the other input's stored rows of their key, emit each pair as ``-D`` (an outer
    join: a preserved row losing its last match is emitted padded, a retracted preserved row
    without a match retracts its padded row), and remove one stored row equal to them, column
    for column. Additions first, so a row retracted in the call that brought it is found. The
    call's output is then netted per row, retractions first (:func:`net_changes`): ``-D`` and
    ``+I`` rows (Flink's outer joins emit these too; its inner join forwards ``-U``/``+U``)."""

    def process(self, batch: KeyedBatch, state: KeyedState) -> Any:
        changes = super().process(batch, state)
        return None if changes is None else net_changes(changes)

    def _arrivals(self, batch: KeyedBatch) -> Iterator[tuple[int, Positions, Arrive]]:
        tags = batch.data.column(INPUT).to_numpy()
        kinds = batch.data.column(ROW_KIND)
        retracting = pc.is_in(kinds, value_set=pa.array(RETRACTIONS)).to_numpy(zero_copy_only=False)
        for side in (0, 1):
            for retracts, arrive in ((False, self._arrive), (True, self._retract)):
                rows = np.flatnonzero((tags == side) & (retracting == retracts))
                if len(rows):
                    yield side, rows, arrive

    def _retract(self, side: int, batch: KeyedBatch, rows: pa.StructArray, state: KeyedState) -> list[pa.Table]:
        other = 1 - side
        stored_rows, lengths, mine, theirs = self._pairs(side, batch, rows, state)
        out = []
        if len(mine):
            keys = batch.keys.take(pa.array(batch.key_index[mine]))
            out.append(self._rows(keys, side, rows.take(pa.array(mine)), stored_rows.take(pa.array(theirs)), DELETE))
        if self.sides.preserved[other]:
            before, after = self._count_matches(state[MATCHES[other]], lengths, theirs, -1)
            last = np.flatnonzero((before > 0) & (after <= 0))  # the other input's rows left without a match
            if len(last):
                out.append(self._padded(batch, lengths, side, stored_rows, last, INSERT))
        if self.sides.preserved[side]:
            alone = np.flatnonzero(np.bincount(mine, minlength=len(rows)) == 0)
            if len(alone):
                keys = batch.keys.take(pa.array(batch.key_index[alone]))
                out.append(self._rows(keys, side, rows.take(pa.array(alone)), None, DELETE))
        self._remove(side, batch, rows, state)
        return out

    def _remove(self, side: int, batch: KeyedBatch, rows: pa.StructArray, state: KeyedState) -> None:
        """One stored row of the key equal to each retracted row leaves the state (with its
        match count); a retraction of a row not stored (expired by state TTL) removes none."""
        view = state[ROWS[side]]
        stored = empty_if_null(view.get())
        lengths = list_lengths(stored)
        flat = pc.list_flatten(stored)
        owners = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        removed = equal_rows_to_remove(flat, owners, rows, batch.key_index)
        kept = lengths - np.bincount(owners[removed], minlength=len(lengths))
        view.update(per_key(flat.filter(pa.array(~removed)), kept))
        if self.sides.preserved[side]:
            counts = pc.list_flatten(empty_if_null(state[MATCHES[side]].get()))
            state[MATCHES[side]].update(per_key(counts.filter(pa.array(~removed)), kept))
        others = list_lengths(state[ROWS[1 - side]].get())
        gone = np.flatnonzero((kept == 0) & (others == 0))
        if len(gone):  # a key with no rows left keeps no state (its slot is freed at compaction)
            emptied = state.of_keys(gone)
            for name in self.state_of(self.sides):
                emptied[name].clear()


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


class IdleChangelogJoinRows(IdleJoinRows, ChangelogJoinRows):
    """A join of changelogs under ``table.exec.state.ttl``."""


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
        rows_view.update(per_key(flat.filter(pa.array(keep)), kept))
        earliest = np.full(len(slots), END_OF_INPUT, dtype=np.int64)
        np.minimum.at(earliest, owners[keep], expiry[keep])
        ValueStateView(store, EXPIRY[side], slots).update(pa.array(earliest, pa.int64(), mask=kept == 0))
        if not self.sides.preserved[side]:
            return None
        counts_view = ListStateView(store, MATCHES[side], slots)
        counts = np.asarray(pc.list_flatten(empty_if_null(counts_view.get())).to_numpy(), dtype=np.int64)
        counts_view.update(per_key(pa.array(counts[keep], pa.int64()), kept))
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
