"""In-memory keyed state of one operator subtask (batch runs; streaming persists it).

Keys map to dense slots through a chunked pandas index (C hash tables), and each declared
state is one column over slots: fixed-width types in typed NumPy arrays with a validity
mask, everything else (strings, lists, maps) as Python objects. Reads and writes take
whole arrays of slots; nothing loops over records.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan.descriptors import StateDescriptor

Slots = npt.NDArray[np.int64]


class StateColumn:
    """Values of one state over slots."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.type = arrow_type
        self._storage = _fixed_width_storage(arrow_type)
        dtype = self._storage.to_pandas_dtype() if self._storage is not None else object
        self._values: np.ndarray = np.empty(0, dtype=dtype)
        self._valid: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)

    def grow(self, size: int) -> None:
        if size <= len(self._valid):
            return
        capacity = max(size, 2 * len(self._valid), 1024)
        self._values = _grown(self._values, capacity)
        self._valid = _grown(self._valid, capacity)

    def get(self, slots: Slots) -> pa.Array:
        valid = self._valid[slots]
        if self._storage is not None:
            return pa.array(self._values[slots], mask=~valid, type=self._storage).view(self.type)
        values = self._values[slots]
        values[~valid] = None
        return pa.array(values, type=self.type)

    def valid(self, size: int) -> npt.NDArray[np.bool_]:
        return self._valid[:size]

    def at_most(self, bound: int, size: int) -> Slots:
        """Slots below ``size`` holding a value ``<= bound`` (a fixed-width column: one NumPy pass)."""
        values = self._values[:size]
        return np.flatnonzero(self._valid[:size] & (values <= bound)).astype(np.int64)

    def set(self, slots: Slots, values: pa.Array) -> None:
        if len(values) != len(slots):
            raise ValueError(f"state update has {len(values)} values for {len(slots)} keys; give one per key")
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if values.type != self.type:
            values = values.cast(self.type)
        valid = ~np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        if self._storage is not None:
            present = values.drop_null().view(self._storage) if values.null_count else values.view(self._storage)
            self._values[slots[valid]] = present.to_numpy(zero_copy_only=False)
        else:
            self._values[slots] = _object_array(values.to_pylist())
        self._valid[slots] = valid


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    grown = np.zeros(capacity, dtype=array.dtype) if array.dtype == bool else np.empty(capacity, dtype=array.dtype)
    grown[: len(array)] = array
    return grown


def _fixed_width_storage(arrow_type: pa.DataType) -> pa.DataType | None:
    """The NumPy-friendly physical type of a fixed-width Arrow type, or None."""
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type):
        return arrow_type
    if pa.types.is_timestamp(arrow_type) or pa.types.is_duration(arrow_type) or pa.types.is_date64(arrow_type):
        return pa.int64()
    if pa.types.is_date32(arrow_type):
        return pa.int32()
    return None


def _object_array(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


class KeyIndex:
    """Key → dense slot, as pandas hash indexes in chunks of doubling size.

    New keys form a new chunk; chunks of similar size merge (a binary counter), so adding
    keys costs amortised O(log n) per key and a lookup probes O(log n) hash tables instead
    of rebuilding one table over all keys every batch.
    """

    def __init__(self) -> None:
        self._chunks: list[tuple[pd.Index, int]] = []  # (keys, first slot)
        self.size = 0

    def lookup(self, keys: pd.Index) -> Slots:
        """Slots of ``keys``; -1 for keys not in the index."""
        slots = np.full(len(keys), -1, dtype=np.int64)
        missing = np.arange(len(keys))
        for chunk, first in self._chunks:
            if not len(missing):
                break
            found = chunk.get_indexer(keys if len(missing) == len(keys) else keys.take(missing))
            hit = found >= 0
            slots[missing[hit]] = found[hit] + first
            missing = missing[~hit]
        return slots

    def add(self, keys: pd.Index) -> Slots:
        slots = np.arange(self.size, self.size + len(keys), dtype=np.int64)
        self._chunks.append((keys, self.size))
        self.size += len(keys)
        while len(self._chunks) > 1 and len(self._chunks[-2][0]) <= 2 * len(self._chunks[-1][0]):
            (older, first), (newer, _) = self._chunks[-2], self._chunks.pop()
            self._chunks[-1] = (_appended([older, newer]), first)
        return slots

    def take(self, slots: Slots) -> pd.Index:
        """The keys of ``slots``, in that order; touches only the chunks they live in."""
        if not self._chunks:
            return pd.Index([])
        if len(self._chunks) == 1 or not len(slots):
            return self._chunks[0][0].take(slots)
        firsts = np.array([first for _, first in self._chunks])
        owner = np.searchsorted(firsts, slots, side="right") - 1
        order = np.argsort(owner, kind="stable")
        pieces = []
        for number in np.unique(owner):
            chunk, first = self._chunks[number]
            pieces.append(chunk.take(slots[order][owner[order] == number] - first))
        grouped = _appended(pieces)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return grouped.take(inverse)


class KeyedStateStore:
    """All declared states of one operator subtask, addressed by key.

    Each slot remembers its key group (state is stored and restored by key group) and
    whether it was touched since the last :meth:`take_touched` (what a checkpoint writes).
    """

    def __init__(self, descriptors: dict[str, StateDescriptor]) -> None:
        self.descriptors = dict(descriptors)
        self.columns = {name: StateColumn(descriptor.arrow_type) for name, descriptor in descriptors.items()}
        self._index = KeyIndex()
        self._key_schema: pa.Schema | None = None
        self._key_groups = np.zeros(0, dtype=np.int32)
        self._touched = np.zeros(0, dtype=bool)

    def __len__(self) -> int:
        return self._index.size

    def slots(self, keys: pa.Table, key_groups: npt.NDArray[np.int32] | None = None) -> Slots:
        """Slots of the given (unique) keys, creating slots for keys never seen; marks them touched."""
        return self.slots_and_key_groups(keys, key_groups)[0]

    def slots_and_key_groups(
        self, keys: pa.Table, key_groups: npt.NDArray[np.int32] | None = None
    ) -> tuple[Slots, npt.NDArray[np.int32]]:
        """:meth:`slots`, and the key group each key had before (-1: a new key), which tells a
        pre-keyed operator the keys it must check (see ``keyflow.state.splits``)."""
        if self._key_schema is None:
            self._key_schema = keys.schema
        index = key_index(keys)
        slots = self._index.lookup(index)
        new = slots < 0
        previous = np.full(len(slots), -1, dtype=np.int32)
        previous[~new] = self._key_groups[slots[~new]]
        if new.any():
            slots[new] = self._index.add(index[new])
            size = self._index.size
            for column in self.columns.values():
                column.grow(size)
            if size > len(self._key_groups):
                capacity = max(size, 2 * len(self._key_groups), 1024)
                self._key_groups = _grown(self._key_groups, capacity)
                self._touched = _grown(self._touched, capacity)
            if key_groups is not None:
                self._key_groups[slots[new]] = key_groups[new]
        self._touched[slots] = True
        return slots, previous

    def key_groups(self, slots: Slots) -> npt.NDArray[np.int32]:
        """The key group of each of ``slots``."""
        key_groups: npt.NDArray[np.int32] = self._key_groups[slots]
        return key_groups

    def touch(self, slots: Slots) -> None:
        """Mark ``slots`` changed (a checkpoint writes them): state set outside :meth:`slots`."""
        self._touched[slots] = True

    def touched(self) -> Slots:
        """Slots touched since the last :meth:`take_touched` (kept for it)."""
        return np.flatnonzero(self._touched[: len(self)]).astype(np.int64)

    def take_touched(self) -> Slots:
        """Slots touched since the last call (and forget them)."""
        touched = self.touched()
        self._touched[:] = False
        return touched

    def all_slots(self) -> Slots:
        return np.arange(len(self), dtype=np.int64)

    def live_slots_in(self, first: int, last: int) -> Slots:
        """Live slots whose key group is in ``first..last``."""
        live = self.live_slots()
        key_groups = self._key_groups[live]
        return live[(key_groups >= first) & (key_groups <= last)]

    def live_slots(self) -> Slots:
        """Slots with at least one state set (a cleared key keeps its slot, with nulls)."""
        live = np.zeros(len(self), dtype=bool)
        for column in self.columns.values():
            live |= column.valid(len(self))
        return np.flatnonzero(live).astype(np.int64)

    def keys(self, slots: Slots) -> pa.Table:
        """The keys of ``slots``, as the key columns they came in."""
        schema = self._key_schema or pa.schema([])
        keys = self._index.take(slots)
        frame = keys.to_frame(index=False) if isinstance(keys, pd.MultiIndex) else pd.DataFrame({0: keys})
        columns = [
            pa.array(frame.iloc[:, position], from_pandas=False).cast(field.type)
            for position, field in enumerate(schema)
        ]
        return pa.Table.from_arrays(columns, schema=schema)

    def to_table(self, slots: Slots) -> pa.Table:
        """Keys, key group and every state of ``slots`` as one Arrow table (the state file format)."""
        table = self.keys(slots).append_column(KEY_GROUP_COLUMN, pa.array(self._key_groups[slots], pa.int32()))
        for name, column in self.columns.items():
            table = table.append_column(name, column.get(slots))
        return table

    def upsert(self, table: pa.Table) -> None:
        """Write rows of the state file format into this store (later rows of a key win)."""
        if table.num_rows == 0:
            return
        key_names = [name for name in table.column_names if name != KEY_GROUP_COLUMN and name not in self.columns]
        key_groups = table.column(KEY_GROUP_COLUMN).to_numpy().astype(np.int32)
        slots = self.slots(table.select(key_names), key_groups)
        for name, column in self.columns.items():
            column.set(slots, table.column(name))
        self._touched[slots] = False


def _appended(indexes: list[pd.Index]) -> pd.Index:
    """Indexes one after another. A MultiIndex is appended level by level: pandas' own
    ``MultiIndex.append`` turns timezone-aware levels into NaT once appended twice (pandas 2.3)."""
    if len(indexes) == 1:
        return indexes[0]
    first = indexes[0]
    if not isinstance(first, pd.MultiIndex):
        return first.append(indexes[1:])
    levels = [
        first.get_level_values(n).append([i.get_level_values(n) for i in indexes[1:]]) for n in range(first.nlevels)
    ]
    return pd.MultiIndex.from_arrays(levels, names=first.names)


def key_index(keys: pa.Table) -> pd.Index:
    frame = keys.to_pandas()
    if keys.num_columns == 1:
        return pd.Index(frame.iloc[:, 0])
    return pd.MultiIndex.from_frame(frame)
