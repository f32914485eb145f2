"""In-memory keyed state of one operator subtask (batch runs; streaming persists it).

Keys map to dense slots through :class:`~keyflow.state.key_index.KeyTable` (C hash
tables), and each declared state is one column over slots: fixed-width types in typed
NumPy arrays with a validity mask, everything else (strings, lists, maps) as Python
objects. Reads and writes take whole arrays of slots; nothing loops over records.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan.descriptors import StateDescriptor
from keyflow.state.key_index import KeyTable, Slots, fixed_width_storage


class StateColumn:
    """Values of one state over slots."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.type = arrow_type
        self._storage = fixed_width_storage(arrow_type)
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


def _object_array(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


class KeyedStateStore:
    """All declared states of one operator subtask, addressed by key.

    Each slot remembers its key group (state is stored and restored by key group) and
    whether it was touched since the last :meth:`take_touched` (what a checkpoint writes).
    """

    def __init__(self, descriptors: dict[str, StateDescriptor]) -> None:
        self.descriptors = dict(descriptors)
        self.columns = {name: StateColumn(descriptor.arrow_type) for name, descriptor in descriptors.items()}
        self._index = KeyTable()
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
        slots = self._index.lookup(keys)
        new = slots < 0
        previous = np.full(len(slots), -1, dtype=np.int32)
        previous[~new] = self._key_groups[slots[~new]]
        if new.any():
            slots[new] = self._index.add(keys.filter(pa.array(new)))
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
        return self._index.take(slots)

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
