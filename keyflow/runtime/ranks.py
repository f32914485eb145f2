"""Flink's streaming Top-N and deduplication in the workers, vectorised per call.

Each key keeps its first ``limit`` rows in order, as a list state of row structs (Flink's
``AppendOnlyTopNFunction`` keeps the same). A call sorts the stored rows of its keys
together with the arriving ones by key, then by the order, then by arrival: a stored row is
older than an arriving one, so on a tie it stays ahead (Flink's order of arrival), except
where the latest row wins (deduplication keeping the last row, Flink's
``RowTimeDeduplicateFunction``). The first ``limit`` of each key become its state, and the
output is the difference, as Flink emits it: a row pushed out is retracted (``-D``) and a
row that entered is added (``+I``); with row numbers every rank whose row changed is
updated (``-U`` old, ``+U`` new) and a rank filled for the first time inserted; a
deduplication replaces its row with ``-U``/``+U``. For an insert-only input a row that left
the top never comes back; a changelog's Top-N (:class:`RetractableTopNRows`) keeps every
current row instead, and re-ranks each key it receives whole (its cost grows with the rows
of a key, where Flink's sorted map touches a few).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.changelog import DELETE, INSERT, OP, RETRACTIONS, UPDATE_AFTER, UPDATE_BEFORE
from keyflow.plan.descriptors import ListState, StateDescriptor, ValueState
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.runtime.row_changes import equal_rows_to_remove, net_changes, per_key
from keyflow.state.keyed import KeyedBatch, KeyedState, ListStateView, empty_if_null, list_lengths, positions_within
from keyflow.state.memory import KeyedStateStore
from keyflow.state.timers import TaskTime, window_fires_at

TOP = "__top_rows"  # each key's first rows, in order

Positions = npt.NDArray[np.int64]


@dataclass(frozen=True)
class RankShape:
    """What a Top-N keeps and emits: rows of ``row_type``, the first ``limit`` per key by
    ``order`` ((field, descending) pairs; nulls first ascending, last descending, as Flink),
    with their row number as ``rank_column`` (or none); ``latest_wins``: on a tie the later
    row goes first; ``replaces``: a changed row is an update (``-U``/``+U``, deduplication)."""

    row_type: pa.StructType
    order: tuple[tuple[str, bool], ...]
    limit: int
    rank_column: str | None
    latest_wins: bool = False
    replaces: bool = False
    first: int = 1  # the first rank emitted (Flink's rank range start); the first ``limit`` are kept

    def state(self) -> dict[str, StateDescriptor]:
        return {TOP: ListState(self.row_type)}


class TopNRows(KeyedFunction):
    """The first rows of each key of a call's rows and its state, and their difference (see the module)."""

    def __init__(self, shape: RankShape, schema: pa.Schema) -> None:
        self.shape, self.schema = shape, schema

    def process(self, batch: KeyedBatch, state: KeyedState) -> pa.Table | None:
        changes = self._changes(*self._keep(batch, state))
        return pa.concat_tables(changes) if changes else None

    def _keep(
        self, batch: KeyedBatch, state: KeyedState
    ) -> tuple[pa.StructArray, Positions, Positions, Positions, Positions]:
        """Each key's first rows of its stored and arriving ones, stored; the candidate rows
        (stored first), their keys, the keys' stored counts, the kept ones and their ranks."""
        shape, view = self.shape, state[TOP]
        stored = empty_if_null(view.get())
        lengths = list_lengths(stored)
        old_rows = pc.list_flatten(stored)
        arriving = self._arriving(batch)
        rows = pa.concat_arrays([old_rows.cast(shape.row_type), arriving])
        owners = np.r_[np.repeat(np.arange(batch.num_keys, dtype=np.int64), lengths), batch.key_index]
        ranked, ranks = self._ranked(rows, owners)
        kept = ranked[ranks < shape.limit]
        kept_lengths = np.bincount(owners[kept], minlength=batch.num_keys)
        offsets = pa.array(np.r_[0, np.cumsum(kept_lengths)], pa.int32())
        view.update(pa.ListArray.from_arrays(offsets, rows.take(pa.array(kept))))
        return rows, owners, lengths, kept, ranks[ranks < shape.limit]

    def _arriving(self, batch: KeyedBatch) -> pa.StructArray:
        """The call's rows as structs of the kept columns."""
        row_type = self.shape.row_type
        columns = [batch.data.column(f.name).combine_chunks().cast(f.type) for f in row_type]
        return pa.StructArray.from_arrays(columns, fields=list(row_type))

    def _ranked(self, rows: pa.StructArray, owners: Positions) -> tuple[Positions, Positions]:
        """The rows' positions sorted by key, order and arrival, and each one's rank (from 0) in its key."""
        columns: dict[str, pa.Array | Positions] = {"owner": owners}
        keys: list[tuple[str, str]] = [("owner", "ascending")]
        for index, (name, descending) in enumerate(self.shape.order):
            direction = "descending" if descending else "ascending"
            values = rows.field(name)
            columns[f"valid{index}"], columns[f"value{index}"] = values.is_valid(), values
            keys.append((f"valid{index}", direction))  # nulls first ascending, last descending
            if pa.types.is_floating(values.type):  # NaN above every number, as Spark and Flink order it
                columns[f"nan{index}"] = pc.fill_null(pc.is_nan(values), False)
                keys.append((f"nan{index}", direction))
            keys.append((f"value{index}", direction))
        columns["arrival"] = np.arange(len(rows), dtype=np.int64)
        keys.append(("arrival", "descending" if self.shape.latest_wins else "ascending"))
        ranked = np.asarray(pc.sort_indices(pa.table(columns), sort_keys=keys).to_numpy(), dtype=np.int64)
        sorted_owners = owners[ranked]
        first = np.r_[True, sorted_owners[1:] != sorted_owners[:-1]] if len(ranked) else np.zeros(0, dtype=bool)
        starts = np.maximum.accumulate(np.where(first, np.arange(len(ranked)), 0)) if len(ranked) else ranked
        return ranked, np.arange(len(ranked), dtype=np.int64) - starts

    def _changes(
        self, rows: pa.StructArray, owners: Positions, lengths: Positions, kept: Positions, ranks: Positions
    ) -> list[pa.Table]:
        """What changed in each key's first rows: ``kept`` (positions in ``rows``, the first
        ``len(lengths)``-summed ones stored before) at ``ranks``; ``lengths``: the keys' stored counts."""
        stored = int(lengths.sum())
        before = np.cumsum(lengths) - lengths  # where each key's stored rows start
        if self.shape.rank_column is None and self.shape.first == 1:
            left = np.setdiff1d(np.arange(stored, dtype=np.int64), kept)
            entered = kept[kept >= stored]
            if self.shape.replaces:  # a deduplication: the key's one row replaced
                had = lengths[owners[entered]] > 0
                return [
                    self._rows(rows, left, None, np.full(len(left), UPDATE_BEFORE)),
                    self._rows(rows, entered, None, np.where(had, UPDATE_AFTER, INSERT)),
                ]
            return [
                self._rows(rows, left, None, np.full(len(left), DELETE)),
                self._rows(rows, entered, None, np.full(len(entered), INSERT)),
            ]
        old_ranks = np.full(len(kept), -1, dtype=np.int64)
        was_stored = kept < stored
        old_ranks[was_stored] = kept[was_stored] - before[owners[kept[was_stored]]]
        same = (old_ranks == ranks) | (ranks < self.shape.first - 1)  # ranks before the first are not emitted
        changed, changed_ranks = kept[~same], ranks[~same]
        refilled = changed_ranks < lengths[owners[changed]]  # the rank had a row: it is updated
        replaced = before[owners[changed[refilled]]] + changed_ranks[refilled]
        ops = np.where(refilled, UPDATE_AFTER, INSERT)
        return [
            self._rows(rows, replaced, changed_ranks[refilled], np.full(len(replaced), UPDATE_BEFORE)),
            self._rows(rows, changed, changed_ranks, ops),
        ]

    def _rows(
        self, rows: pa.StructArray, positions: Positions, ranks: Positions | None, ops: npt.NDArray[np.str_]
    ) -> pa.Table:
        """The rows at ``positions`` as output rows (their row numbers: ``ranks`` + 1) of row kinds ``ops``."""
        taken = rows.take(pa.array(positions, pa.int64()))
        columns = {field.name: taken.field(field.name) for field in self.shape.row_type}
        if self.shape.rank_column is not None:
            assert ranks is not None
            columns[self.shape.rank_column] = pa.array(ranks + 1, pa.int64())
        columns[OP] = pa.array(ops.astype(object) if len(ops) else [], pa.string())
        return pa.table(columns)


ALL = "__all_rows"  # a Top-N of a changelog: each key's current rows


class RetractableTopNRows(TopNRows):
    """Flink's RetractableTopNFunction, vectorised per call: each key keeps every current row
    (additions stored, a retraction removing one equal row) and the first rows it last
    emitted; a call ranks each of its keys' current rows and emits the difference from what
    it last emitted, netted per row with retractions first (``-D``/``+I``, with row numbers
    where the query keeps them; Flink updates a rank with ``-U``/``+U``: the same table)."""

    @staticmethod
    def state_of(shape: RankShape) -> dict[str, StateDescriptor]:
        return {ALL: ListState(shape.row_type), TOP: ListState(shape.row_type)}

    def process(self, batch: KeyedBatch, state: KeyedState) -> pa.Table | None:
        shape, arriving = self.shape, self._arriving(batch)
        retracting = pc.is_in(batch.data.column(OP), value_set=pa.array(RETRACTIONS)).to_numpy(zero_copy_only=False)
        stored = empty_if_null(state[ALL].get())
        added = np.flatnonzero(~retracting)
        rows = pa.concat_arrays([pc.list_flatten(stored).cast(shape.row_type), arriving.take(pa.array(added))])
        owners = np.r_[
            np.repeat(np.arange(batch.num_keys, dtype=np.int64), list_lengths(stored)), batch.key_index[added]
        ]
        retracted = np.flatnonzero(retracting)
        if len(retracted):
            removed = equal_rows_to_remove(rows, owners, arriving.take(pa.array(retracted)), batch.key_index[retracted])
            rows, owners = rows.filter(pa.array(~removed)), owners[~removed]
        by_key = np.argsort(owners, kind="stable")
        state[ALL].update(per_key(rows.take(pa.array(by_key)), np.bincount(owners, minlength=batch.num_keys)))
        ranked, ranks = self._ranked(rows, owners)
        top, top_ranks = ranked[ranks < shape.limit], ranks[ranks < shape.limit]
        before = empty_if_null(state[TOP].get())
        before_lengths = list_lengths(before)
        before_rows, before_ranks = pc.list_flatten(before).cast(shape.row_type), positions_within(before_lengths)
        state[TOP].update(per_key(rows.take(pa.array(top)), np.bincount(owners[top], minlength=batch.num_keys)))
        shown, was_shown = top_ranks >= shape.first - 1, before_ranks >= shape.first - 1
        changes = [
            self._rows(
                before_rows, np.flatnonzero(was_shown), before_ranks[was_shown], np.full(int(was_shown.sum()), DELETE)
            ),
            self._rows(rows, top[shown], top_ranks[shown], np.full(int(shown.sum()), INSERT)),
        ]
        net = net_changes(pa.concat_tables(changes))
        return net if net.num_rows else None


WINDOW_ENDS = "__window_ends"  # a window Top-N's key (its partition holds the window): when the window ends


class WindowTopNRows(TopNRows):
    """Flink's WindowRank: a Top-N partitioned by the windows of a window aggregation. Each
    key (window included) keeps its first rows until the watermark passes the window's end;
    then they are emitted once, insert-only, and the key's state is cleared. The aggregation
    emits a window's rows when it fires, so they have all arrived by then."""

    timed = True

    def __init__(self, shape: RankShape, schema: pa.Schema, window_end: str) -> None:
        super().__init__(shape, schema)
        self.window_end = window_end

    @staticmethod
    def state_of(shape: RankShape) -> dict[str, StateDescriptor]:
        return {**shape.state(), WINDOW_ENDS: ValueState(pa.int64())}

    def process(self, batch: KeyedBatch, state: KeyedState) -> None:
        self._keep(batch, state)
        state[WINDOW_ENDS].update(window_fires_at(batch.keys.column(self.window_end)))
        return None

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[pa.Table]:
        slots = store.columns[WINDOW_ENDS].at_most(time.watermark, len(store))
        if not len(slots):
            return
        stored = empty_if_null(ListStateView(store, TOP, slots).get())
        lengths = list_lengths(stored)
        rows = pc.list_flatten(stored)
        ranks = positions_within(lengths)
        shown = np.flatnonzero(ranks >= self.shape.first - 1)
        table = self._rows(rows, shown, ranks[shown], np.full(len(shown), INSERT))
        store.clear(slots)
        yield table.drop_columns([OP])
