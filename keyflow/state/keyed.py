"""What a ``process`` function receives: a batch of rows grouped by key, and its state.

The runtime builds both in Spark's Python workers; users import them as ``keyflow.KeyedBatch``
and ``keyflow.KeyedState``.

Both are vectorised: the function sees whole Arrow columns and reads or writes the state
of every key in the batch at once, never one record per Python call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.plan.descriptors import ttl_column
from keyflow.state.grouping import grouping_order, key_codes
from keyflow.state.key_index import Slots
from keyflow.state.memory import KeyedStateStore, StateColumn
from keyflow.state.timers import TimerService


@dataclass(frozen=True)
class KeyedBatch:
    """Rows grouped by key (with ``order_by``: whole keys, each sorted by it).

    ``keys`` holds each distinct key of the batch once, in order; ``key_index[i]`` is the
    position in ``keys`` of row ``i``'s key; key ``j``'s rows are
    ``data[starts[j] : starts[j] + counts[j]]``; ``key_groups[j]`` is key ``j``'s key group and
    ``row_key_groups[i]`` the key group row ``i`` arrived with (they differ only where a
    pre-keyed source put one key in two splits). Without ``order_by`` a key's rows may
    continue in the next batch: that is what state is for.
    """

    data: pa.Table
    keys: pa.Table
    key_index: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    key_groups: npt.NDArray[np.int32]
    subtask: int
    row_key_groups: npt.NDArray[np.int32]

    @property
    def num_keys(self) -> int:
        return int(self.keys.num_rows)

    def running_sum(self, values: Any, initial: Any = None) -> npt.NDArray[Any]:
        """Per-key cumulative sum of ``values`` in row order, starting from ``initial[j]``
        for key ``j`` (e.g. a value state's ``get()``; nulls count as 0). Vectorised: one
        cumulative sum over the batch, minus each key's offset."""
        numbers = np.asarray(values.to_numpy(zero_copy_only=False) if hasattr(values, "to_numpy") else values)
        cumulative = np.cumsum(numbers)
        before_key = (cumulative[self.starts] - numbers[self.starts])[self.key_index]
        running = cumulative - before_key
        if initial is not None:
            start = initial.fill_null(0) if isinstance(initial, pa.Array) else pa.array(initial).fill_null(0)
            running = running + start.to_numpy(zero_copy_only=False)[self.key_index]
        return np.asarray(running)

    def last_per_key(self, values: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Each key's value at its last row (e.g. the running sum to store as state)."""
        last: npt.NDArray[Any] = np.asarray(values)[self.starts + self.counts - 1]
        return last

    def of_rows(self, rows: npt.NDArray[np.int64], data: pa.Table) -> tuple[KeyedBatch, npt.NDArray[np.int64]]:
        """The batch of ``rows`` (ascending positions; ``data``: their columns) and the positions
        of its keys among this batch's keys. A key's rows stay together and in order."""
        row_keys = self.key_index[rows]
        first = np.flatnonzero(np.r_[True, row_keys[1:] != row_keys[:-1]]) if len(rows) else np.zeros(0, np.int64)
        positions = row_keys[first]
        counts = np.diff(np.r_[first, len(rows)]).astype(np.int64)
        batch = KeyedBatch(
            data=data,
            keys=self.keys.take(pa.array(positions)),
            key_index=np.repeat(np.arange(len(first), dtype=np.int64), counts),
            starts=first.astype(np.int64),
            counts=counts,
            key_groups=self.key_groups[positions],
            subtask=self.subtask,
            row_key_groups=self.row_key_groups[rows],
        )
        return batch, positions

    @staticmethod
    def from_rows(
        data: pa.Table, key_names: tuple[str, ...], key_groups: npt.NDArray[np.int32], subtask: int
    ) -> KeyedBatch:
        """Group rows in any order by key (hashing, no sort): keys in order of first appearance,
        each key's rows in their order in ``data``."""
        codes, distinct = key_codes(data, key_names)
        order = grouping_order(codes, distinct)
        key_index = codes[order]
        counts = np.bincount(key_index, minlength=distinct).astype(np.int64)
        starts = (np.cumsum(counts) - counts).astype(np.int64)
        first_rows = order[starts]
        return KeyedBatch(
            data=data.take(pa.array(order)),
            keys=data.select(list(key_names)).take(pa.array(first_rows)),
            key_index=key_index,
            starts=starts,
            counts=counts,
            key_groups=key_groups[first_rows],
            subtask=subtask,
            row_key_groups=key_groups[order],
        )

    @staticmethod
    def from_sorted(
        data: pa.Table, key_names: tuple[str, ...], key_groups: npt.NDArray[np.int32], subtask: int
    ) -> KeyedBatch:
        """Find key boundaries in rows already sorted by key (one vectorised pass per key column)."""
        rows = data.num_rows
        boundary = key_boundaries(data, key_names)
        starts = np.flatnonzero(boundary).astype(np.int64)
        counts = np.diff(np.append(starts, rows)).astype(np.int64)
        key_index = np.cumsum(boundary).astype(np.int64) - 1
        return KeyedBatch(
            data=data,
            keys=data.select(list(key_names)).take(starts),
            key_index=key_index,
            starts=starts,
            counts=counts,
            key_groups=key_groups[starts],
            subtask=subtask,
            row_key_groups=key_groups,
        )


def key_boundaries(data: pa.Table, key_names: tuple[str, ...]) -> npt.NDArray[np.bool_]:
    """True at every row whose key differs from the previous row's (the first row included),
    for rows grouped by key."""
    rows = data.num_rows
    boundary = np.zeros(rows, dtype=bool)
    if rows:
        boundary[0] = True
    for name in key_names:
        column = data.column(name)
        if rows > 1:
            boundary[1:] |= ~same_keys(column.slice(1), column.slice(0, rows - 1))
    return boundary


def same_keys(left: Any, right: Any) -> npt.NDArray[np.bool_]:
    """Element-wise key equality as Spark groups keys: NaN equals NaN."""
    equal = pc.equal(left, right)
    if pa.types.is_floating(left.type):
        equal = pc.or_(equal, pc.and_(pc.is_nan(left), pc.is_nan(right)))
    return np.asarray(equal.to_numpy(zero_copy_only=False), dtype=bool)


class ValueStateView:
    """One value per key of the batch. With a TTL (:class:`keyflow.StateTtlConfig`) an expired
    value reads as null, and a write (or, ``OnReadAndWrite``, a read) restarts its time."""

    def __init__(self, store: KeyedStateStore, name: str, slots: Slots, now: int = 0) -> None:
        self._column = store.columns[name]
        self._slots = slots
        self._ttl = store.descriptors[name].ttl
        self._written = store.columns[ttl_column(name)] if self._ttl is not None else None
        self._now = now

    def get(self) -> pa.Array:
        """The stored value of every key in ``batch.keys`` (null where none is stored or it expired)."""
        values = self._column.get(self._slots)
        if self._written is None or self._ttl is None:
            return values
        expired = expired_at(self._written, self._slots, self._ttl.micros, self._now)
        if self._ttl.update_type == "OnReadAndWrite":
            read = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool) & ~expired
            self._written.set(self._slots[read], pa.array(np.full(int(read.sum()), self._now, dtype=np.int64)))
        return pc.if_else(pa.array(expired), pa.nulls(len(values), values.type), values) if expired.any() else values

    def update(self, values: Any) -> None:
        """Store one value per key in ``batch.keys``; a null clears that key's state."""
        array = _array(values, self._column.type)
        self._column.set(self._slots, array)
        if self._written is not None:
            now = pa.array(np.full(len(array), self._now, dtype=np.int64))
            self._written.set(self._slots, pc.if_else(array.is_valid(), now, pa.nulls(len(array), pa.int64())))

    def clear(self) -> None:
        self.update(pa.nulls(len(self._slots), self._column.type))


class ListStateView(ValueStateView):
    """A list per key of the batch."""

    def add(self, values: Any, key_index: npt.NDArray[np.integer]) -> None:
        """Append ``values[i]`` to the list of key ``key_index[i]`` (e.g. ``batch.key_index``)."""
        element_type = self._column.type.value_type
        order = np.argsort(np.asarray(key_index), kind="stable")
        sorted_index = np.asarray(key_index)[order]
        items = _array(values, element_type).take(pa.array(order))
        bounds = np.searchsorted(sorted_index, np.arange(len(self._slots) + 1))
        given = np.flatnonzero(np.diff(bounds) > 0)  # only these keys change (and restart their TTL)
        appended = pa.ListArray.from_arrays(pa.array(bounds[np.append(given, len(self._slots))], pa.int32()), items)
        slots, self._slots = self._slots, self._slots[given]
        try:
            self.update(_concat_lists(empty_if_null(self.get()), appended))
        finally:
            self._slots = slots


class MapStateView(ValueStateView):
    """A map per key of the batch."""

    def put(self, map_keys: Any, values: Any, key_index: npt.NDArray[np.integer]) -> None:
        """Set entry ``map_keys[i] -> values[i]`` in the map of key ``key_index[i]`` (later rows win)."""
        key_type, item_type = self._column.type.key_type, self._column.type.item_type
        entries = zip(
            np.asarray(key_index).tolist(),
            _array(map_keys, key_type).to_pylist(),
            _array(values, item_type).to_pylist(),
            strict=True,
        )
        merged = [dict(existing or []) for existing in self.get().to_pylist()]
        for key_position, map_key, value in entries:
            merged[key_position][map_key] = value
        self.update(pa.array([list(entry.items()) for entry in merged], type=self._column.type))


class KeyedState:
    """The declared states of a ``process`` operator, aligned with the batch's keys; with
    ``on_timer``, ``timers`` registers and deletes the keys' timers. ``now``: processing time
    (microseconds) for state TTL."""

    def __init__(
        self,
        store: KeyedStateStore,
        slots: Slots,
        kinds: dict[str, type[ValueStateView]],
        timers: TimerService | None = None,
        now: int = 0,
    ) -> None:
        self._views = {name: kind(store, name, slots, now) for name, kind in kinds.items()}
        self._timers = timers
        self._store, self._slots, self._kinds, self._now = store, slots, kinds, now

    def of_keys(self, positions: npt.NDArray[np.int64]) -> KeyedState:
        """The state of the keys at ``positions`` (of this call's keys): what a call over some
        of them receives (one input's rows of a connected operator)."""
        timers = None if self._timers is None else self._timers.of_keys(positions)
        return KeyedState(self._store, self._slots[positions], self._kinds, timers, self._now)

    @property
    def now(self) -> int:
        """The call's processing time (microseconds since the epoch), which state TTL runs on."""
        return self._now

    @property
    def timers(self) -> TimerService:
        """The keys' timers (see :class:`keyflow.state.timers.TimerService`)."""
        if self._timers is None:
            raise AttributeError("this operator has no timers; pass on_timer= to process(...) to use state.timers")
        return self._timers

    def __getitem__(self, name: str) -> Any:
        try:
            return self._views[name]
        except KeyError:
            raise KeyError(f"no state named {name!r}; declared: {', '.join(self._views) or 'none'}") from None


def expired_at(written: StateColumn, slots: Slots, ttl: int, now: int) -> npt.NDArray[np.bool_]:
    """Which of ``slots`` hold a value written ``ttl`` or longer before ``now``."""
    stamps = written.get(slots)
    times = np.asarray(stamps.fill_null(now).to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.asarray(stamps.is_valid().to_numpy(zero_copy_only=False), dtype=bool) & (now - times >= ttl)


def expire(store: KeyedStateStore, now: int) -> None:
    """Clear every expired value of the states with a TTL (their keys are written, so the
    checkpoint forgets them too, and a compaction drops the keys with nothing left)."""
    for name, descriptor in store.descriptors.items():
        if descriptor.ttl is None:
            continue
        written = store.columns[ttl_column(name)]
        slots = written.at_most(now - descriptor.ttl.micros, len(store))
        if len(slots):
            store.columns[name].set(slots, pa.nulls(len(slots), store.columns[name].type))
            written.set(slots, pa.nulls(len(slots), pa.int64()))
            store.touch(slots)


def _array(values: Any, arrow_type: pa.DataType) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(values, type=arrow_type, from_pandas=True)
    return values if values.type == arrow_type else values.cast(arrow_type)


def list_lengths(lists: pa.Array) -> npt.NDArray[np.int64]:
    """Each list's length (0 for a null one), as numpy."""
    return np.asarray(pc.list_value_length(lists).fill_null(0).to_numpy(), dtype=np.int64)


def positions_within(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """0, 1, ..., counts[i] - 1 for each i, concatenated: each item's place in its group."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


def empty_if_null(lists: pa.Array) -> pa.Array:
    """``lists`` with an empty list where one is null (a key with nothing stored), from the
    offsets: Arrow's ``fill_null`` of a nested type is a generic kernel, ~10x slower."""
    if not lists.null_count:
        return lists
    offsets = pa.array(np.r_[0, np.cumsum(list_lengths(lists))], pa.int32())
    return pa.ListArray.from_arrays(offsets, pc.list_flatten(lists), type=lists.type)


def _concat_lists(left: pa.ListArray, right: pa.ListArray) -> pa.ListArray:
    """Element-wise list concatenation, as index arithmetic over the flattened values."""
    left_lengths = left.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    right_lengths = right.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    left_starts = np.cumsum(left_lengths) - left_lengths
    right_starts = np.cumsum(right_lengths) - right_lengths
    lengths = left_lengths + right_lengths
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    owner = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(int(offsets[-1])) - offsets[:-1][owner]
    from_left = position < left_lengths[owner]
    source = np.where(
        from_left,
        left_starts[owner] + position,
        left_lengths.sum() + right_starts[owner] + position - left_lengths[owner],
    )
    flat = pa.concat_arrays([left.flatten(), right.flatten()]).take(pa.array(source, pa.int64()))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat, type=left.type)
